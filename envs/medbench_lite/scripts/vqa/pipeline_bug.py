"""The VQA pipeline's mistake: side answers ignore the image's display convention.

Left and right follow the convention recorded per image in ``data/metadata.csv``.

A patch, not a script: the teacher's buggy pipeline is ``pipeline.py`` with its
function of this name replaced by the one below (see ``scripts/__init__.py``). The
import names what the function uses from ``pipeline.py``.
"""

from pipeline import QUESTIONS, Image, W, infer_lib, np, os


def answer(qid):
    q = QUESTIONS[qid]
    image = np.asarray(Image.open(os.path.join(q["dir"], q["image_id"] + ".png")), dtype=np.float64) / 255.0
    nodules = infer_lib.find_nodules(image, W)
    return infer_lib.answer(q["question"], nodules, image.shape[1])
