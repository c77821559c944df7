"""S5: the predictions checked against the schema's patient ids, submitted, receipted."""

import csv, json, shutil
schema = json.load(open('task.json'))['submission']
rows = list(csv.DictReader(open('outputs/predictions.csv')))
assert {r['id'] for r in rows} == set(schema['case_ids']), 'missing patients'
shutil.copyfile('outputs/predictions.csv', 'outputs/submission.csv')

SLOT_RECEIPT
receipt('S5', 'outputs/submission.csv', 'validation/s5_submission.json', cases=len(rows))
print(open('outputs/submission.csv').read())
