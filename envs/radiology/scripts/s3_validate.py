"""S3: a one-patient pilot where a trap shows, checked against the card's own reading, receipted.

The check (``SLOT_CHECK``, ``pilot_check.py``) picks the first patient whose current
study a careless reading measures wrong, and after the pilot reads that patient's
studies as the model card says: the receipt states the case, the lesion's size on the
current study (the figure), and whether the pilot's row is the card's (both diameters
within 0.05 mm, and the change).
"""

import csv, glob, json, os, subprocess
SLOT_CHECK
patients = json.load(open('task.json'))['patients']
def studies(pid):
    return sorted(glob.glob(os.path.join('data/dicom', pid, '*')))  # prior, current
pick = next((p for p in patients if trap(studies(p)[-1])), patients[0])
print('pilot patient', pick, '-', trap(studies(pick)[-1]))
os.makedirs('validation', exist_ok=True)
subprocess.run(['python', 'pipeline/infer.py', 'validation/pilot.csv', pick], check=True)
print(open('validation/pilot.csv').read())
row = next(csv.DictReader(open('validation/pilot.csv')))
prior_dir, current_dir = studies(pick)
d, p = card_diameter(current_dir), card_diameter(prior_dir)
change = 'larger' if d - p > 2.0 else ('smaller' if p - d > 2.0 else 'stable')
passed = abs(float(row['diameter_mm']) - d) <= 0.05 and abs(float(row['prior_mm']) - p) <= 0.05 and row['change'] == change
figure_name, figure_value = size_name(current_dir), round(lesion_size(current_dir), 3)
print('CHECK', 'OK' if passed else 'FAILED', pick, figure_name, '=', figure_value, '| pilot', row['diameter_mm'], row['prior_mm'], row['change'], '| card', d, p, change)

SLOT_RECEIPT
receipt('S3', 'validation/pilot.csv', 'validation/s3_validation.json', cases=1,
        check={'case': pick, 'name': figure_name, 'value': figure_value, 'passed': passed})
