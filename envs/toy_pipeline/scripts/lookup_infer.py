
import csv, json, sys
model = json.load(open("model/model.json"))
wanted = set(sys.argv[2:])
out = sys.argv[1]
rows = [r for r in csv.DictReader(open("data/cases.csv")) if not wanted or r["id"] in wanted]
with open(out, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["id", "score"])
    for r in rows:
        w.writerow([r["id"], f'{model["table"][r["code"].strip().lower()]:.4f}'])
