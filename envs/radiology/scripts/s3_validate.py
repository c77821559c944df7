"""S3: the pipeline on the first patient of task.json, the pilot shown and receipted."""

import json, os, subprocess
first = json.load(open('task.json'))['patients'][0]
os.makedirs('validation', exist_ok=True)
subprocess.run(['python', 'pipeline/infer.py', 'validation/pilot.csv', first], check=True)
print(open('validation/pilot.csv').read())

SLOT_RECEIPT
receipt('S3', 'validation/pilot.csv', 'validation/s3_validation.json', cases=1)
