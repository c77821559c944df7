"""skill_ladder's S3 pays the teacher's checked pilot, not an unchecked one (see tests/rubrics/test_validation_exploit.py)."""

from __future__ import annotations

from row_checks import assert_paid_for_validation, audit_unchecked_pilot


def test_skill_ladder_pays_the_teacher_not_the_unchecked_pilot(ladder, ladder_bank):
    assert_paid_for_validation(*audit_unchecked_pilot(ladder, ladder_bank))
