"""Property-based tests (hypothesis) over every reply parser and environment ``step``, and
over SFT JSONL lines: random text, decoded random bytes, huge replies, control characters,
nested backticks and tags never raise; an unusable reply is an invalid action with its
penalty; a bad JSONL line is a ``ValueError`` saying what is wrong. The targets and their
inputs live in ``bench/fuzz_targets.py`` (``bench/fuzz.py`` runs them for a fixed budget)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from fuzz_targets import Target, targets

TARGETS = targets()


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_a_target_never_raises_on_generated_input_but_its_clear_error(target: Target) -> None:
    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(target.inputs)
    def check(value):  # type: ignore[no-untyped-def]
        try:
            target.call(value)
        except target.allowed as err:
            assert str(err), f"{target.name}: an error without a message"

    check()


def test_a_malformed_jsonl_line_names_what_is_wrong() -> None:
    sft = next(t for t in TARGETS if t.name == "sft.parse_line")
    for line, says in (("{", "not valid JSON"), ("[1, 2]", "expected a JSON object"),
                       ('{"x": 1}', "expected a 'messages' list")):
        with pytest.raises(ValueError, match=says):
            sft.call(line)


def _leaf_keys(data: dict, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    out: list[tuple[tuple[str, ...], object]] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out += _leaf_keys(value, (*prefix, key))
        else:
            out.append(((*prefix, key), value))
    return out


def _config_error(path: tuple[str, ...], value: object, tmp_path: Path) -> Exception | None:
    import yaml

    from treeroll.config import load_config
    from treeroll.config_checks import check_config

    data: dict = {}
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(data))
    try:
        check_config(load_config(file))
    except Exception as err:  # the test checks which kind
        return err
    return None


def test_every_config_key_with_a_wrong_type_is_refused_naming_it(tmp_path) -> None:
    from treeroll.config import TrainConfig, config_to_dict

    unclear, accepted = [], []
    for path, default in _leaf_keys(config_to_dict(TrainConfig())):
        for wrong in ("x", [1, 2], {"a": 1}, 3.5, True):
            if type(wrong) is type(default) or (isinstance(default, float)
                                                and type(wrong) in (int, float)):
                continue
            if isinstance(default, str) and isinstance(wrong, (int, float)):
                continue  # YAML scalars read as text where text is expected
            err = _config_error(path, wrong, tmp_path)
            key = path[-1]
            if err is None:
                accepted.append((".".join(path), wrong))
            elif not (isinstance(err, ValueError)
                      and (key in str(err) or key.replace("_", "-") in str(err))):
                unclear.append((".".join(path), wrong, f"{type(err).__name__}: {err}"[:120]))
    assert not unclear, f"errors that do not name the key: {unclear[:10]}"
    optional = {".".join(p) for p, d in _leaf_keys(config_to_dict(TrainConfig())) if d is None}
    assert all(k in optional or k.endswith("options") for k, _ in accepted), (
        f"wrong types accepted: {[a for a in accepted if a[0] not in optional][:10]}")


def test_negative_seeds_and_sizes_are_refused_before_work(tmp_path) -> None:
    for path in (("seed",), ("env", "task_seed"), ("eval", "seed"),
                 ("policy", "model", "max_positions")):
        assert isinstance(_config_error(path, -5, tmp_path), ValueError), ".".join(path)


def test_every_numeric_config_key_refuses_a_huge_negative_value_naming_it(tmp_path) -> None:
    from treeroll.config import TrainConfig, config_to_dict

    accepted, unclear = [], []
    for path, default in _leaf_keys(config_to_dict(TrainConfig())):
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            continue
        bad = -1e9 if isinstance(default, float) else -10**9
        err = _config_error(path, bad, tmp_path)
        key = path[-1]
        if err is None:
            accepted.append(".".join(path))
        elif not (isinstance(err, ValueError)
                  and (key in str(err) or key.replace("_", "-") in str(err))):
            unclear.append((".".join(path), f"{type(err).__name__}: {err}"[:120]))
    assert not accepted, f"out-of-range values accepted: {accepted}"
    assert not unclear, f"errors that do not name the key: {unclear}"
