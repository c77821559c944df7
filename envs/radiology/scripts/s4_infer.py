"""S4: the pipeline on every patient, counted and receipted."""

import csv, os, subprocess
os.makedirs('outputs', exist_ok=True)
subprocess.run(['python', 'pipeline/infer.py', 'outputs/predictions.csv'], check=True)
n = sum(1 for _ in csv.DictReader(open('outputs/predictions.csv')))
print(n, 'patients measured')

SLOT_RECEIPT
receipt('S4', 'outputs/predictions.csv', 'validation/s4_completion.json', cases=n)
