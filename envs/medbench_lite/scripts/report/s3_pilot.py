"""S3: on a case with a nodule, each reported size matches a measurement across it."""

import nibabel as nib
# Pilot the case with the most conspicuous nodule so the size can be cross-checked.
case_id, rows = None, None
for cid in case_ids:
    rows = infer.run([cid], "validation/pilot.csv", "validation/pilot")
    if rows[0]["n_findings"] > 0:
        case_id = cid
        break
found = json.load(open("validation/pilot/" + case_id + ".json")) if case_id else []
can = nib.as_closest_canonical(nib.load(f"data/images/{case_id or case_ids[0]}.nii.gz"))
v, sx = can.get_fdata(), float(can.header.get_zooms()[0])
errs = []
for f in found:
    i, j, k = (int(round(c)) for c in f["center_vox"])
    line = v[:, j, k] > -400  # independent measurement: extent across the centre along x
    a = b = i
    while a > 0 and line[a - 1]:
        a -= 1
    while b < len(line) - 1 and line[b + 1]:
        b += 1
    measured = (b - a + 1) * sx
    errs.append((f["diameter_mm"], round(measured, 1)))
print("pilot", case_id, "findings", [(f["lobe"], f["diameter_mm"]) for f in found], "| reported vs measured x-extent (mm):", errs)
print(open("validation/pilot/" + (case_id or case_ids[0]) + ".txt").read())
case_id = case_id or case_ids[0]
checks = {
    "a pilot case with a finding": {"value": len(found), "expect": ">= 1", "ok": len(found) >= 1},
    "reported diameter vs measured x-extent, mm": {
        "value": errs, "expect": "within max(1.5 voxels, 30%)",
        "ok": bool(errs) and all(abs(r - m) <= max(1.5 * sx, 0.3 * m) for r, m in errs)},
}
