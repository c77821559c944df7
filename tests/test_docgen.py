"""The reference pages for benchmark authors are what the code generates.

``docs/reference/*.md`` are generated from the code (``python -m bat_gym.cli.docgen
docs/reference``) and committed, so they read in the repository and every change to a
check or a contract model shows in review as a change of its page; this test fails
when a committed page differs from what the code generates now.
"""

from pathlib import Path

import pytest

from bat_gym.cli import docgen
from bat_gym.core.spec import BenchmarkSpec, Stage
from bat_gym.rubrics.contract import checks
from bat_gym.rubrics.contract import model as contract

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


@pytest.mark.parametrize("name", sorted(docgen.PAGES))
def test_the_committed_page_is_what_the_code_generates(name):
    committed = (REFERENCE / name).read_text(encoding="utf-8")
    assert committed == docgen.render(name), (
        f"docs/reference/{name} is out of date: run `python -m bat_gym.cli.docgen docs/reference` "
        "and commit the result"
    )


def test_every_builtin_check_is_in_the_catalogue_with_its_arguments():
    page = docgen.render("checks.md")
    for name in checks.check_names():
        if checks.get_check(name).__module__ not in checks.BUILTIN_MODULES:
            continue
        assert f"### {name}\n" in page
        for arg in checks.CHECKS[name].args.model_fields:
            assert f"| `{arg}` |" in page
    assert "| [`task_metric_at_least`](#task_metric_at_least) | none |" in page


def test_a_check_registered_by_a_plugin_stays_out_of_the_reference():
    # Other tests and installed plugins register checks in this process; the page must
    # not depend on them.
    before = docgen.render("checks.md")

    @checks.register_check("docgen_probe", evidence="none")
    def probe(ctx, *, level: int = 1):
        """A probe."""

    try:
        assert "docgen_probe" not in docgen.render("checks.md")
        assert docgen.render("checks.md") == before
    finally:
        checks.CHECKS.unregister("docgen_probe")


def test_the_schema_pages_have_every_field():
    contracts = docgen.render("contracts.md")
    for model in (contract.RubricContract, contract.RubricItem, contract.Level, contract.Component):
        assert f"## {model.__name__}\n" in contracts
        assert all(f"| `{field}` |" in contracts for field in model.model_fields)
    spec = docgen.render("benchmark.md")
    for model in (BenchmarkSpec, Stage):
        assert all(f"| `{field}` |" in spec for field in model.model_fields)
    assert "### `make_task(track: str, seed: int, split: Split) -> Task`\n\n**Abstract" in spec


def test_type_names_read_as_yaml():
    from typing import Annotated, Literal

    from pydantic import Field

    assert docgen.type_name(list[str] | None) == "list of string or null"
    assert docgen.type_name(Literal["a", "b"]) == '"a" or "b"'
    assert (
        docgen.type_name(Annotated[list[str], Field(min_length=2)])
        == "list of string (at least 2 items)"
    )
    assert docgen.type_name(dict[str, float]) == "mapping of string to number"
