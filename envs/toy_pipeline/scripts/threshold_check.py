"""The threshold track's S3 check: the values' unit, which the model's threshold is not in."""

unit = json.load(open('task.json'))['value_unit']; print('values are in', unit, '; model threshold is in cm')
