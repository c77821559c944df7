import io

import numpy as np
import pytest
from PIL import Image

from bat_gym.viewer import ImageError, to_png

from .artifacts import nifti_bytes, png_bytes


def decode(data):
    return Image.open(io.BytesIO(data))


def test_nifti_middle_slice_is_drawn_with_the_label_visible():
    img = decode(to_png(nifti_bytes((16, 12, 5)), "seg.nii.gz"))
    assert img.size == (16, 12)  # columns = x, rows = y
    a = np.asarray(img)
    assert a.min() == 0 and a.max() == 255  # background black, the label white


def test_dicom_frame_is_drawn(tmp_path):
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.4"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(tmp_path / "x.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
    pixels = np.arange(20 * 10, dtype=np.uint16).reshape(20, 10) * 7
    ds.Rows, ds.Columns = pixels.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
    ds.SamplesPerPixel, ds.PixelRepresentation = 1, 0
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.PixelData = pixels.tobytes()
    ds.save_as(tmp_path / "x.dcm", enforce_file_format=True)
    img = decode(to_png((tmp_path / "x.dcm").read_bytes(), "frame.dcm"))
    assert img.size == (10, 20)


def test_png_passes_through_and_junk_is_refused():
    data = png_bytes()
    assert to_png(data, "a.png") == data
    with pytest.raises(ImageError, match="NIfTI"):
        to_png(b"not an image", "a.nii")
    with pytest.raises(ImageError, match="not an image the viewer draws"):
        to_png(data, "a.txt")


def test_episode_page_shows_image_artifacts(eval_images):
    from bat_gym.viewer import Site

    site = Site([eval_images])
    key = sorted(p.stem for p in (eval_images / "episodes").glob("*.json"))[0]
    html = site.get(f"r0-ep-{key}.html")[0].decode()
    srcs = [s for s in html.split('src="')[1:] if s.startswith("r0-img-")]
    assert len(srcs) == 2
    for src in srcs:
        name = src.split('"')[0]
        data, kind = site.get(name)
        assert kind == "image/png" and decode(data).size[0] > 0


def test_a_gzip_bomb_is_refused(monkeypatch):
    import gzip

    from bat_gym.viewer import images

    monkeypatch.setattr(images, "MAX_VOLUME_BYTES", 1 << 20)
    bomb = gzip.compress(b"\0" * (4 << 20))
    with pytest.raises(ImageError, match="expands past"):
        to_png(bomb, "big.nii.gz")
