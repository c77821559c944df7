"""S5: the predictions checked against the schema's case ids, submitted, receipted."""

import csv, json, shutil
schema = json.load(open('task.json'))['submission']
rows = list(csv.DictReader(open('outputs/predictions.csv')))
assert [r['id'] for r in rows] == [i for i in schema['case_ids'] if i in {r['id'] for r in rows}]
assert {r['id'] for r in rows} == set(schema['case_ids']), 'missing cases'
shutil.copyfile('outputs/predictions.csv', 'outputs/submission.csv')

SLOT_RECEIPT
receipt('S5', 'outputs/submission.csv', 'validation/s5_submission.json', cases=len(rows))
print('submitted', len(rows))
