"""A fixture's scan and the oracle's models, kept on disk beside the fixtures (``facts``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workloads import facts, oracle
from workloads.fixtures import ensure_fixture
from workloads.registry import Models, get_workload

REPO = Path(__file__).resolve().parents[1]
SEED, SCALE, ROUNDS = 3, 0.02, 3


def model_in_a_new_process(cache: Path) -> dict[str, list[object]]:
    """The model of publish as a new process's ``Models`` gives it: path -> [size, sha256]."""
    code = (
        "import json, sys; from pathlib import Path\n"
        "from workloads.fixtures import ensure_fixture\n"
        "from workloads.registry import Models, get_workload\n"
        f"f = ensure_fixture('publish', {SEED}, {SCALE}, Path(sys.argv[1]))\n"
        f"m = Models().model(get_workload('publish'), {SEED}, {SCALE}, {ROUNDS}, f)\n"
        "print(json.dumps({r: [s.size, s.sha256] for r, s in m.files.items()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(cache)], cwd=REPO, text=True,
                          capture_output=True, check=True)  # fmt: skip
    return json.loads(done.stdout)


def facts_of(cache: Path) -> dict[str, dict[str, object]]:
    """The facts kept in the fixture cache ``cache``, by kind (the key's first element)."""
    kept = [json.loads(p.read_text()) for p in (cache / facts.FACTS_DIR).glob("*.json")]
    return {fact["key"][0]: fact for fact in kept}


def test_a_model_is_kept_for_the_next_campaign_and_a_damaged_one_is_computed_again(
    tmp_path: Path,
) -> None:
    """A model computed by one process (a campaign) is kept beside the fixture, with the
    fixture's scan; the next process takes it from there: a model kept there with a changed
    hash (and a digest that fits it) is what it gets, so it did not compute its own. A kept
    fact that is damaged or whose digest does not fit is ignored, computed again and written
    again."""
    cache = tmp_path / "fixtures"
    computed = model_in_a_new_process(cache)
    kept = facts_of(cache)
    assert set(kept) == {"model", "scan"}
    fixture = ensure_fixture("publish", SEED, SCALE, cache)
    workload = get_workload("publish")
    assert kept["model"]["key"][1:6] == [
        "publish",
        SEED,
        repr(SCALE),
        ROUNDS,
        list(workload.ignore),
    ]
    assert kept["model"]["body"]["files"] == computed
    here = workload.model(SEED, SCALE, ROUNDS, fixture).files
    assert computed == {r: [s.size, s.sha256] for r, s in here.items()}

    # a fact the next process must take as it is: one hash changed, its digest made to fit
    key, body = kept["model"]["key"], kept["model"]["body"]
    rel = min(body["files"])
    body["files"][rel][1] = "0" * 64
    facts.store(fixture, key, body)
    assert model_in_a_new_process(cache)[rel][1] == "0" * 64

    # damaged: the digest no longer fits (or the file is cut short): computed again, rewritten
    path = next(p for p in (cache / facts.FACTS_DIR).glob("*.json")
                if json.loads(p.read_text())["key"][0] == "model")  # fmt: skip
    text = path.read_text()
    path.write_text(text.replace("0" * 64, "1" * 64))
    assert model_in_a_new_process(cache) == computed
    assert facts_of(cache)["model"]["body"]["files"] == computed
    path.write_text(path.read_text()[:100])
    assert model_in_a_new_process(cache) == computed
    assert facts_of(cache)["model"]["body"]["files"] == computed


def test_a_fixture_built_again_is_a_new_fixture(tmp_path: Path) -> None:
    """A fact names its fixture's identity: the same fixture built again (a new directory) does
    not take the facts of the one before, and a scan read back equals the scan computed."""
    cache = tmp_path / "fixtures"
    fixture = ensure_fixture("repo-inspect", SEED, SCALE, cache)
    workload = get_workload("repo-inspect")
    first = facts.fact_key("scan", fixture, workload.ignore)
    files, dirs = oracle.scan_tree(fixture, workload.ignore)
    oracle._scan_cached.cache_clear()
    assert oracle.scan_cached(fixture, workload.ignore) == (files, frozenset(dirs))
    assert facts.load(fixture, first) is not None
    oracle._scan_cached.cache_clear()
    assert oracle.scan_cached(fixture, workload.ignore) == (files, frozenset(dirs))  # read back
    fixture.rename(tmp_path / "old")
    fixture = ensure_fixture("repo-inspect", SEED, SCALE, cache)
    assert facts.fact_key("scan", fixture, workload.ignore) != first
    assert Models().model(workload, SEED, SCALE, ROUNDS, fixture).files


def test_the_facts_of_other_code_are_deleted(tmp_path: Path) -> None:
    """A fact names the code that made it; writing one deletes those of other code (a lab host
    updated many times keeps only what its code can use)."""
    cache = tmp_path / "fixtures"
    fixture = ensure_fixture("publish", SEED, SCALE, cache)
    facts_dir = cache / facts.FACTS_DIR
    facts_dir.mkdir()
    stale = facts_dir / f"{'0' * facts.CODE_PREFIX}-{'1' * 40}.json"
    stale.write_text("{}")
    Models().model(get_workload("publish"), SEED, SCALE, ROUNDS, fixture)
    names = sorted(p.name for p in facts_dir.iterdir())
    assert stale.name not in names
    assert len(names) == 2 and all(
        n.startswith(facts.code_digest()[: facts.CODE_PREFIX]) for n in names
    )


def test_a_fact_that_is_not_a_model_is_computed_again(tmp_path: Path) -> None:
    """A fact whose digest fits but whose body is not a model (a file's state of one value, no
    directories) is computed again, not an error."""
    cache = tmp_path / "fixtures"
    computed = model_in_a_new_process(cache)
    fixture = ensure_fixture("publish", SEED, SCALE, cache)
    key = facts_of(cache)["model"]["key"]
    facts.store(fixture, key, {"files": {"x": [1]}, "ignore": []})
    assert model_in_a_new_process(cache) == computed
    assert facts_of(cache)["model"]["body"]["files"] == computed
