"""The lookup track's S3 check: the codes as the data spells them, and as the model's table does.

Sets ``pick`` (the case to pilot: one whose code the table lacks as written), the
check's figure (``figure_name``, ``figure_value``: the case's code normalized as the
card says) and ``expected`` (the table's score for it).
"""

model = json.load(open('model/model.json'))
rows = list(csv.DictReader(open('data/cases.csv')))
print('codes seen:', sorted({r['code'] for r in rows}))
# Pilot where normalization shows: a code not written the table's way.
risky = [r for r in rows if r['code'] != r['code'].strip().lower()]
row = (risky or rows)[0]
pick = row['id']
figure_name, figure_value = 'model_code', row['code'].strip().lower()
expected = model['table'][figure_value]
