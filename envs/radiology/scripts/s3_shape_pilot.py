"""S3, the ``failure`` outcome's pilot: one patient through the pipeline, checked for shape only.

The first patient, its id, two diameters and a change word: what a pipeline that
trusts stored values and descriptions also passes. The receipt states that check,
which names no figure of the studies (``columns``), so it confirms nothing about the
traps.
"""

import csv, json, os, subprocess
pick = json.load(open('task.json'))['patients'][0]
os.makedirs('validation', exist_ok=True)
subprocess.run(['python', 'pipeline/infer.py', 'validation/pilot.csv', pick], check=True)
rows = list(csv.DictReader(open('validation/pilot.csv')))
passed = [r['id'] for r in rows] == [pick] and rows[0]['change'] in ('larger', 'smaller', 'stable')
print('SHAPE', 'OK' if passed else 'FAILED', pick, rows)

SLOT_RECEIPT
receipt('S3', 'validation/pilot.csv', 'validation/s3_validation.json', cases=1,
        check={'case': pick, 'name': 'columns', 'value': 4, 'passed': passed})
