"""S3: the track's data check (``SLOT_CHECK``), a one-case pilot on the case it picks, and its receipt.

The receipt states the check: the case, the figure the check computed, and whether
the pilot's score is the one the card gives.
"""

import csv, json, math, subprocess
SLOT_CHECK
import os; os.makedirs('validation', exist_ok=True)
subprocess.run(['python', 'pipeline/infer.py', 'validation/pilot.csv', pick], check=True)
print(open('validation/pilot.csv').read())
got = float(next(csv.DictReader(open('validation/pilot.csv')))['score'])
passed = abs(got - expected) <= 1e-4
print('CHECK', 'OK' if passed else 'FAILED', pick, figure_name, '=', figure_value, '| pilot', got, 'card', expected)

SLOT_RECEIPT
receipt('S3', 'validation/pilot.csv', 'validation/s3_validation.json', cases=1,
        check={'case': pick, 'name': figure_name, 'value': figure_value, 'passed': passed})
