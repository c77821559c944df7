"""S3, the ``failure`` outcome's pilot: one case through the pipeline, checked for shape only.

The first case, its id and a score with four decimals: what a pipeline that misses the
track's trap also passes. The receipt states that check, which names no figure of the
data (``score_decimals``), so it confirms nothing about the trap.
"""

import csv, os, re, subprocess
os.makedirs('validation', exist_ok=True)
pick = next(csv.DictReader(open('data/cases.csv')))['id']
subprocess.run(['python', 'pipeline/infer.py', 'validation/pilot.csv', pick], check=True)
rows = list(csv.DictReader(open('validation/pilot.csv')))
passed = [r['id'] for r in rows] == [pick] and re.fullmatch(r'\d\.\d{4}', rows[0]['score']) is not None
print('SHAPE', 'OK' if passed else 'FAILED', pick, rows)

SLOT_RECEIPT
receipt('S3', 'validation/pilot.csv', 'validation/s3_validation.json', cases=1,
        check={'case': pick, 'name': 'score_decimals', 'value': 4, 'passed': passed})
