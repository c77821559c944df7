"""Plugins: one registry mechanism, fed by entry points, that a third-party package extends."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

from bat_gym.core import plugins
from bat_gym.core.errors import (
    PluginError,
    PluginNotFound,
    PolicyNotFound,
    SandboxBackendNotFound,
    SelectorNotFound,
)
from bat_gym.core.plugins import Registry, load_target, summary
from bat_gym.core.protocol import PROTOCOLS, HermesProtocol
from bat_gym.core.sandbox import BACKENDS, make_sandbox
from bat_gym.curriculum.selection import SELECTORS, PaperSelector
from bat_gym.policies import POLICIES, PolicyKind, kind_table, make_policy, spec_forms

# -- a third-party package, made on the spot -------------------------------------------

PACKAGE = '''
"""A package that adds a policy kind and a sandbox backend to bat_gym."""

import os

from bat_gym.policies import PolicyKind
from bat_gym.policies.scripted import ScriptedPolicy
from bat_gym.core.sandbox.local import LocalSandbox


class EchoPolicy(ScriptedPolicy):
    """The benchmark's teacher under another name, labelled by its spec."""

    def __init__(self, label, **options):
        super().__init__("teacher", **options)
        self.label = label

    def identity(self):
        return {"kind": "mykind", "label": self.label}


def build(argument, **options):
    return EchoPolicy(argument or "unlabelled", **options)


KIND = PolicyKind(
    forms=("mykind:LABEL",),
    description="the teacher, labelled (a third-party policy)",
    build=build,
    sampling=False,
)


class MySandbox(LocalSandbox):
    """A local sandbox that notes each one made."""

    backend = "mysandbox"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        log = os.environ.get("MYSANDBOX_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write("made\\n")
'''

ENTRY_POINTS = """
[bat_gym.policies]
mykind = acme_bat_plugins:KIND

[bat_gym.sandboxes]
mysandbox = acme_bat_plugins:MySandbox
"""


def _install(site: Path, name: str, entry_points: str, module: str | None = None) -> None:
    """Lay out an installed distribution in ``site``: its code and its ``.dist-info``."""
    dist = site / f"{name}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    if module is not None:
        (site / f"{name}.py").write_text(textwrap.dedent(module))


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """The package on ``sys.path``, as ``pip install`` would leave it; gone afterwards."""
    site = tmp_path / "site"
    _install(site, "acme_bat_plugins", ENTRY_POINTS, PACKAGE)
    monkeypatch.syspath_prepend(str(site))  # and invalidates the import caches
    yield site
    POLICIES.unregister("mykind")  # drops what was loaded; the entry point went with sys.path
    BACKENDS.unregister("mysandbox")
    sys.modules.pop("acme_bat_plugins", None)


def test_a_third_party_policy_kind_is_made_by_its_spec(third_party):
    assert "mykind" in POLICIES
    assert "mykind:LABEL" in spec_forms()
    policy = make_policy("mykind:hello")
    assert type(policy).__name__ == "EchoPolicy" and policy.identity()["label"] == "hello"
    assert "the teacher, labelled (a third-party policy)" in kind_table()


def test_a_third_party_sandbox_backend_is_made_by_name(third_party):
    assert "mysandbox" in BACKENDS
    with make_sandbox("mysandbox") as box:
        assert type(box).__name__ == "MySandbox"
        assert box.execute_code("python", "print(6 * 7)").output.strip() == "42"
    with pytest.raises(SandboxBackendNotFound, match="Did you mean 'mysandbox'"):
        make_sandbox("mysandbx")


def test_gym_make_plays_in_a_third_party_sandbox(third_party, toy_bank):
    env = gym.make(
        "bat/Validate-v0", benchmark="toy_pipeline", backend="mysandbox", states=toy_bank
    )
    try:
        env.reset(seed=0)
        assert type(env.unwrapped.sandbox).__name__ == "MySandbox"
    finally:
        env.close()


def _cli(args: list[str], site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "bat_gym.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200", **env},
    )


def test_bat_gym_eval_offers_and_plays_a_third_party_policy_in_its_sandbox(third_party, tmp_path):
    shown = _cli(["eval", "--help"], third_party)
    assert shown.returncode == 0, shown.stderr
    assert "mykind:LABEL" in shown.stdout and "openai:URL#MODEL" in shown.stdout
    assert "mysandbox" in shown.stdout  # --backend lists the installed backends

    log, out = tmp_path / "made.log", tmp_path / "eval"
    args = ["eval", "--benchmark", "toy_pipeline", "--policy", "mykind:hello"]
    args += ["--backend", "mysandbox", "--repeats", "1", "--out", str(out), "--quiet"]
    played = _cli(args, third_party, MYSANDBOX_LOG=str(log))
    assert played.returncode == 0, played.stdout + played.stderr
    assert "overall 1.000" in played.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["policy"]["kind"], manifest["policy"]["label"]) == ("mykind", "hello")
    assert log.read_text().count("made") >= 1


def test_an_unknown_policy_names_every_form_and_where_plugins_come_from():
    with pytest.raises(PolicyNotFound) as raised:
        make_policy("teachr:recovery")
    message = str(raised.value)
    assert "unknown policy 'teachr'" in message and "Did you mean 'teacher'?" in message
    for form in ("teacher:OUTCOME", "hf:PATH", "vllm:PATH", "openai:URL#MODEL"):
        assert form in message
    assert "'bat_gym.policies'" in message
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, KeyError)


# -- the registry ----------------------------------------------------------------------


def test_the_shipped_plugins_arrive_through_their_entry_points():
    assert {"teacher", "naive", "hf", "vllm", "openai"} <= set(POLICIES)
    assert {"local", "docker"} <= set(BACKENDS)
    assert {"hermes", "json", "openai"} <= set(PROTOCOLS)
    assert {"paper", "deficit", "progress"} <= set(SELECTORS)
    assert PROTOCOLS["hermes"] is HermesProtocol and SELECTORS["paper"] is PaperSelector


def test_bat_gyms_own_checks_and_exploits_are_declared_as_they_register():
    # Importing their modules registers each in this process (a name declared for
    # another object is refused there); each must be declared too, so that
    # `bat-gym plugins` lists it without importing it.
    from bat_gym.audits.exploits import EXPLOITS
    from bat_gym.rubrics.contract.checks import BUILTIN_MODULES, CHECKS

    own = (*BUILTIN_MODULES, "bat_gym.envs.radiology.checks")
    for module in own:
        importlib.import_module(module)
    declared = {
        kind: {n for n, _, dist in plugins.declared(f"bat_gym.{kind}") if dist == "bat-gym"}
        for kind in ("checks", "exploits")
    }
    assert {n for n in CHECKS if CHECKS[n].fn.__module__ in own} == declared["checks"]
    assert {n for n in EXPLOITS if EXPLOITS[n].__module__.startswith("bat_gym.")} == declared[
        "exploits"
    ]


def test_names_are_listed_without_loading_and_loaded_once(tmp_path, monkeypatch):
    registry: Registry[object] = Registry("acme.tests.lazy")
    registry.register("later", "acme_not_imported_yet:THING")
    assert list(registry) == ["later"] and "later" in registry
    assert "acme_not_imported_yet" not in sys.modules
    (tmp_path / "acme_not_imported_yet.py").write_text("THING = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert registry["later"] is registry["later"]
    finally:
        sys.modules.pop("acme_not_imported_yet", None)


def test_a_registration_in_process_shadows_an_entry_point_until_it_is_dropped():
    class Mine(PaperSelector):
        """A selector of this test."""

    SELECTORS.register("paper", Mine)
    try:
        assert SELECTORS["paper"] is Mine
    finally:
        SELECTORS.unregister("paper")
    assert SELECTORS["paper"] is PaperSelector


def test_an_unknown_name_lists_the_known_and_close_ones():
    registry: Registry[object] = Registry("acme.tests.names", not_found=SelectorNotFound)
    registry.register("alpha", object())
    registry.register("beta", object())
    with pytest.raises(SelectorNotFound) as raised:
        registry["alpah"]
    assert str(raised.value) == (
        "unknown selector 'alpah'. Did you mean 'alpha'? Known: alpha, beta. A package adds "
        "one by declaring it in the entry point group 'acme.tests.names'."
    )
    assert raised.value.group == "acme.tests.names" and raised.value.known == ["alpha", "beta"]
    assert registry.get("alpah") is None  # a Mapping: a missing name is a KeyError
    assert isinstance(raised.value, PluginNotFound)


def test_a_loose_spelling_resolves_when_it_matches_one_name():
    registry: Registry[int] = Registry("acme.tests.spelling", spelling=str.lower)
    registry.register("Alpha", 1)
    assert registry["ALPHA"] == 1 and registry.resolve("alpha") == "Alpha"
    registry.register("ALPHA", 2)
    with pytest.raises(PluginNotFound):
        registry["alpha"]  # two names spell it: neither is chosen


@pytest.mark.parametrize(
    ("registry", "plugin", "problem"),
    [
        (BACKENDS, object, "not a Sandbox subclass"),
        (PROTOCOLS, HermesProtocol, "calls itself 'hermes'"),
        (SELECTORS, PaperSelector, "calls itself 'paper'"),
        (POLICIES, 42, "not a PolicyKind"),
        (POLICIES, PolicyKind(("other:X",), "a kind", make_policy), "each must start with"),
    ],
)
def test_a_plugin_its_kind_cannot_use_is_refused_by_name(registry, plugin, problem):
    registry.register("acme_wrong", plugin)
    try:
        with pytest.raises(PluginError, match=problem):
            registry["acme_wrong"]
    finally:
        registry.unregister("acme_wrong")


def test_two_packages_declaring_one_name_differently_are_refused(tmp_path, monkeypatch):
    for name, value in (("acme_one", "json:loads"), ("acme_two", "json:dumps")):
        _install(tmp_path, name, f"[acme.tests.clash]\nshared = {value}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[object] = Registry("acme.tests.clash")
    assert list(registry) == ["shared"]
    with pytest.raises(PluginError, match=r"declared differently by acme_one \(json:loads\)"):
        registry["shared"]


def test_describe_gives_one_line_each_and_names_a_broken_plugin():
    registry: Registry[object] = Registry("acme.tests.describe")
    registry.register("paper", PaperSelector)
    registry.register("broken", "acme_no_such_module:THING")
    described = registry.describe()
    assert described["paper"] == summary(PaperSelector)
    assert "\n" not in described["paper"] and described["paper"].startswith("The paper's rule")
    assert described["broken"].startswith("(cannot be loaded: ModuleNotFoundError")


def test_load_target_names_what_it_cannot_find():
    assert load_target("json:loads") is json.loads
    assert load_target("os.path:join") is os.path.join
    with pytest.raises(PluginError, match="not 'module:attribute'"):
        load_target("json.loads")
    with pytest.raises(PluginError, match="has no attribute 'nothing'"):
        load_target("json:nothing")


def test_a_kind_no_distribution_declares_says_to_reinstall_bat_gym(monkeypatch):
    # bat_gym declares every kind itself; an installed metadata without them is stale.
    monkeypatch.setattr(plugins, "_declared", lambda: {})
    with pytest.raises(PluginError, match=r"metadata is older than its source; reinstall"):
        Registry("bat_gym.checks")["file_exists"]
    with pytest.raises(PluginNotFound):  # a kind of another package: simply not found
        Registry("acme.tests.empty")["file_exists"]


def test_entry_points_are_read_again_only_when_installed_metadata_changes(tmp_path, monkeypatch):
    """Files coming and going in a sys.path entry (the working directory) cost no rescan."""
    reads = []
    real = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points", lambda: reads.append(1) or real())
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins._declared()
    before = len(reads)
    for i in range(5):  # a busy folder: its mtime changes, its metadata does not
        (tmp_path / f"run-{i}.log").write_text("x")
        plugins._declared()
    assert len(reads) == before
    meta = tmp_path / "late_plugin-1.0.dist-info"  # a distribution installed meanwhile
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: late-plugin\nVersion: 1.0\n")
    (meta / "entry_points.txt").write_text("[bat_gym.selectors]\nlate = late_plugin:Late\n")
    names = [entry[:2] for entry in plugins.declared("bat_gym.selectors")]
    assert ("late", "late_plugin:Late") in names
    assert len(reads) == before + 1
