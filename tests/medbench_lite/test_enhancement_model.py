"""The enhancement model against the track's generator: isocentre, artifact fit, trap."""

import gzip

import nibabel as nib
import numpy as np

from bat_gym.envs.medbench_lite.models import enhancement as model


def _stacks(bench, seed, split):
    draw = bench.draw("enhancement", seed, split)
    for cid in draw.case_ids:
        raw = gzip.decompress(draw.files[f"data/images/{cid}.nii.gz"])
        yield draw, cid, nib.Nifti1Image.from_bytes(raw).get_fdata()


def test_the_model_finds_the_isocentre_of_every_stack(bench):
    for draw, cid, hu in _stacks(bench, 1_000_001, "heldout"):
        found = model.find_isocentre(model.to_unit(hu, draw.weights), draw.weights)
        assert np.hypot(*np.subtract(found, draw.answers["isocentre"][cid])) < 0.5, cid


def test_removing_the_artifact_leaves_about_the_noise(bench):
    draw, cid, hu = next(_stacks(bench, 1_000_000, "heldout"))
    w = draw.weights
    x = model.to_unit(hu, w)
    offset = model.find_isocentre(x, w)
    clean = draw.answers["clean"][cid]
    for k in range(hu.shape[-1]):
        soft = (clean[..., k] > -200) & (clean[..., k] < 300)
        fixed = model.from_unit(model.remove_artifact(x[..., k], k, w, offset)[0], w)
        before = np.std((hu[..., k] - clean[..., k])[soft])
        after = np.std((fixed - clean[..., k])[soft])
        # What is left is mostly the noise, not the rings and bands.
        assert after < 2 * draw.params["noise_hu"] and after < 0.6 * before, (k, before, after)


def test_given_hu_the_model_returns_its_input(bench):
    draw, _, hu = next(_stacks(bench, 3, "train"))
    assert np.abs(model.denoise(hu, draw.weights) - hu).max() < 1.0
