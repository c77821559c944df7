"""The lookup track's S3 check: the codes as the data spells them."""

print('codes seen:', sorted({r['code'] for r in csv.DictReader(open('data/cases.csv'))}))
