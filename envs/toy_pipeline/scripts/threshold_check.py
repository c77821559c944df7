"""The threshold track's S3 check: the values' unit, which the model's threshold is not in.

Sets ``pick`` (the case to pilot: one whose score changes when the unit is ignored),
the check's figure (``figure_name``, ``figure_value``: the case's value in cm, the
model's unit) and ``expected`` (the score the card gives that value).
"""

unit = json.load(open('task.json'))['value_unit']; print('values are in', unit, '; model threshold is in cm')
model = json.load(open('model/model.json'))
SCALE = {"mm": 0.1, "cm": 1.0, "m": 100.0}
def card_score(cm):
    return round(1.0 / (1.0 + math.exp(-(cm - model["threshold"]) / model["width"])), 4)
rows = list(csv.DictReader(open('data/cases.csv')))
# Pilot where the unit shows: a case whose score, read as if in cm, would differ.
risky = [r for r in rows if abs(card_score(float(r['value']) * SCALE[unit]) - card_score(float(r['value']))) > 1e-4]
row = (risky or rows)[0]
pick = row['id']
figure_name, figure_value = 'value_cm', round(float(row['value']) * SCALE[unit], 6)
expected = card_score(float(row['value']) * SCALE[unit])
