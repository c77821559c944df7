"""S2: the questions, the images and the display convention each is recorded in."""

import csv
from PIL import Image
qs = [json.loads(line) for line in open("data/questions.jsonl")]
dev = [json.loads(line) for line in open("data/dev/questions.jsonl")]
meta = {r["image_id"]: r for r in csv.DictReader(open("data/metadata.csv"))}
images = {}
for q in qs:
    im = Image.open(f"data/images/{q['image_id']}.png")
    images[q["image_id"]] = {"size": list(im.size), "mode": im.mode, "png_text": dict(im.text),
                             "metadata_convention": meta[q["image_id"]]["view_convention"]}
conv = {}
for v in images.values():
    conv[v["metadata_convention"]] = conv.get(v["metadata_convention"], 0) + 1
compat = {"input_format": "PNG + JSONL", "questions": len(qs), "expected": len(case_ids), "dev_questions": len(dev),
          "images": images, "display_conventions": conv,
          "model_input": "float image in [0, 1]; convention argument, default neurological (model card)"}
print(len(qs), "questions on", len(images), "images;", len(dev), "dev questions with answers")
print("display conventions:", conv)
print("question types:", sorted({q["question"] for q in qs}))
