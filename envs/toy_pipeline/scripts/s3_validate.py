"""S3: the track's data check (``SLOT_CHECK``), a one-case pilot, and its receipt."""

import csv, json, subprocess
SLOT_CHECK
first = next(csv.DictReader(open('data/cases.csv')))['id']
import os; os.makedirs('validation', exist_ok=True)
subprocess.run(['python', 'pipeline/infer.py', 'validation/pilot.csv', first], check=True)
print(open('validation/pilot.csv').read())

SLOT_RECEIPT
receipt('S3', 'validation/pilot.csv', 'validation/s3_validation.json', cases=1)
