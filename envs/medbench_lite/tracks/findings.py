"""Textured findings and their look-alikes, shared by the 2D lesion tracks.

A task's finding (the opacity, lesion or nodule its model was trained on) is a bright
disk with a partial-volume edge and an internal stripe texture of one orientation and
period, both drawn per task. Every task also holds look-alikes: disks of the same
size, brightness and period whose stripes run at the other ``TYPES - 1`` orientations,
``180 / TYPES`` degrees apart. The finding type and the look-alike types enter every
task in exchangeable roles (same count, same size and brightness distribution, same
placement rule), so the public files say which orientations occur but not which of
them is the finding: only the provided model, whose matched filter holds the task's
orientation, does. That is what makes the model carry the task: a shortcut that
detects bright blobs finds the look-alikes too, and one that clusters the blobs by
texture still has to guess which cluster is the finding (one chance in ``TYPES``).

Every function here is pure: arrays in, arrays out, randomness only from the
generator passed in.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "TYPES",
    "orientations",
    "finding",
    "matched_kernel",
    "correlated_texture",
    "vessels",
    "place",
    "balanced_types",
]

TYPES = 6
"""Texture orientations per task: index 0 is the finding, 1..5 are look-alikes."""


def orientations(rng: np.random.Generator) -> np.ndarray:
    """The task's ``TYPES`` stripe orientations (radians in ``[0, pi)``); ``[0]`` is the finding.

    The finding's orientation is uniform and the others follow at equal steps, so the
    set of orientations in a task does not tell which one is the finding.
    """
    t0 = rng.uniform(0.0, np.pi)
    return (t0 + np.arange(TYPES) * np.pi / TYPES) % np.pi


def finding(
    shape: tuple[int, int],
    center: tuple[float, float],
    radius: float,
    theta: float,
    period: float,
    amplitude: float,
    modulation: float,
    phase: float,
) -> np.ndarray:
    """One textured disk, as an additive intensity image of ``shape``.

    ``amplitude * occupancy * (1 + modulation * cos(2 pi u / period + phase))`` with
    ``u`` the distance along the stripe normal at angle ``theta`` (radians from the
    column axis, in pixels) and ``occupancy`` the disk's pixel coverage with a one-pixel
    partial-volume edge. The mean brightness over the disk does not depend on
    ``theta``, so orientation is invisible to size and intensity statistics.
    """
    rr, cc = np.mgrid[: shape[0], : shape[1]] + 0.5
    dy, dx = rr - center[0], cc - center[1]
    occ = np.clip(radius + 0.5 - np.hypot(dy, dx), 0.0, 1.0)
    u = dx * np.cos(theta) + dy * np.sin(theta)
    return amplitude * occ * (1.0 + modulation * np.cos(2 * np.pi * u / period + phase))


def matched_kernel(
    theta: float, period: float, radius: float, dc: float, taper: bool = False
) -> np.ndarray:
    """The matched filter a model holds: stripes at ``theta`` in a disk, plus ``dc``.

    Shape ``(2R+1, 2R+1)`` with ``R = ceil(radius)``; the stripe part is zero-mean over
    the disk and normalised to unit energy, and ``dc`` (per disk pixel) weights the
    disk's mean brightness, so a bright textured blob of the right orientation responds
    most and a dark (inverted) one least. ``taper``: the stripes are weighted by a
    Gaussian of standard deviation ``radius / 2`` inside the disk, which makes the
    filter answer less to a blob's edge and more to its texture.
    """
    r = int(np.ceil(radius))
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1].astype(np.float64)
    disk = (np.hypot(yy, xx) <= radius).astype(np.float64)
    u = xx * np.cos(theta) + yy * np.sin(theta)
    window = disk * np.exp(-0.5 * (yy**2 + xx**2) / (radius / 2) ** 2) if taper else disk
    stripes = np.cos(2 * np.pi * u / period) * window
    stripes[disk > 0] -= window[disk > 0] * stripes.sum() / window.sum()
    stripes /= np.sqrt((stripes**2).sum())
    return stripes + dc * disk / disk.sum()


def correlated_texture(
    rng: np.random.Generator, shape: tuple[int, int], scale: float
) -> np.ndarray:
    """Zero-mean, unit-variance anatomical texture: white noise low-passed at ``scale`` px."""
    f = np.fft.rfft2(rng.standard_normal(shape))
    ky = np.fft.fftfreq(shape[0])[:, None]
    kx = np.fft.rfftfreq(shape[1])[None, :]
    f *= np.exp(-0.5 * (ky**2 + kx**2) * (2 * np.pi * scale) ** 2)
    t = np.fft.irfft2(f, s=shape)
    return (t - t.mean()) / (t.std() + 1e-12)


def vessels(
    rng: np.random.Generator, shape: tuple[int, int], count: int, width: float, amplitude: float
) -> np.ndarray:
    """``count`` gently curved bright tubes (vessels, rib edges), partial-volume edged."""
    rr, cc = np.mgrid[: shape[0], : shape[1]] + 0.5
    out = np.zeros(shape)
    for _ in range(count):
        y0, x0 = rng.uniform(0, shape[0]), rng.uniform(0, shape[1])
        ang = rng.uniform(0, np.pi)
        bend = rng.uniform(-0.02, 0.02)
        # Distance to a parabola-bent line through (y0, x0) at angle ang.
        along = (cc - x0) * np.cos(ang) + (rr - y0) * np.sin(ang)
        across = -(cc - x0) * np.sin(ang) + (rr - y0) * np.cos(ang) - bend * along**2
        tube = np.clip(width / 2 + 0.5 - np.abs(across), 0.0, 1.0)
        out = np.maximum(out, amplitude * rng.uniform(0.6, 1.0) * tube)
    return out


def place(
    rng: np.random.Generator,
    radii: list[float],
    inside,
    gap: float,
    tries: int = 400,
) -> list[tuple[float, float, float]]:
    """Non-overlapping centres for disks of ``radii``.

    Args:
        rng: the task's generator.
        radii: disk radii in px, placed in order.
        inside: ``inside(radius) -> (cy, cx) | None``: a candidate centre, drawn from
            ``rng``, where a disk of that radius fits (None: try again).
        gap: the least distance in px between two disks' edges.
        tries: candidates per disk before it is left out.

    Returns:
        ``(cy, cx, r)`` per placed disk (a disk with no room is dropped).
    """
    out: list[tuple[float, float, float]] = []
    for r in radii:
        for _ in range(tries):
            c = inside(r)
            if c is None:
                continue
            if all(np.hypot(c[0] - y, c[1] - x) > r + r2 + gap for y, x, r2 in out):
                out.append((float(c[0]), float(c[1]), float(r)))
                break
    return out


def balanced_types(rng: np.random.Generator, per_type: int) -> np.ndarray:
    """``per_type`` findings of every type, shuffled: each type equally often in a task."""
    t = np.repeat(np.arange(TYPES), per_type)
    rng.shuffle(t)
    return t
