"""Adding an environment takes one file and one line of registration: ``tests/plugins/
tiny_lake.py`` (an :class:`~treeroll.envs.EnvSpec` with its settings block) and an entry
point, as a package of the user's own would declare it (``[project.entry-points.
"treeroll.envs"]``). A fresh interpreter then takes it by name, its settings as
``env.tiny_lake.*`` in YAML and on the command line (``--help`` lists them), checks them with
the block's own ``problems()``, and grows trees in it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.plugins.installed import help_and_refusal, install, run_python


def _site(tmp_path: Path) -> Path:
    return install(tmp_path / "site", "tiny_lake", "[treeroll.envs]\ntiny_lake = tiny_lake:SPEC\n"
                   "plain_lake = tiny_lake:PLAIN\n")


def test_an_environment_in_one_file_and_one_entry_point_is_configured_and_grows_trees(
        tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  name: tiny_lake\n  tiny_lake:\n    side: 3\n"
                      "rollout:\n  max_turn_tokens: 24\n")
    done = run_python(_site(tmp_path), f"""
        import json
        from treeroll.cli.one_tree import build_one_tree
        from treeroll.config import load_config
        from treeroll.envs import ENVS, make_env_factory
        from treeroll.tree import leaves

        config = load_config({str(config)!r})
        env = make_env_factory(config.env)()
        env.reset(5)
        tree = build_one_tree(config, task_seed=3)
        print(json.dumps({{"registered": "tiny_lake" in ENVS, "side": env.size,
                          "leaves": len(leaves(tree))}}))
        """)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"registered": True, "side": 3, "leaves": found["leaves"]}
    assert found["leaves"] >= 1


def test_the_command_line_offers_the_environments_settings_and_its_check_runs(tmp_path):
    _, refused = help_and_refusal(_site(tmp_path), "--env.tiny-lake.side",
                                  ["--env.name", "tiny_lake", "--env.tiny-lake.side", "6"])
    assert "at most 4" in refused, refused


def test_an_environment_whose_settings_have_no_check_across_fields_is_accepted(tmp_path):
    # plain_lake's settings dataclass has no problems() method: the checks must not need one
    done = run_python(_site(tmp_path), """
        import json
        from treeroll.config import TrainConfig
        from treeroll.config_checks import check_config
        from treeroll.envs import EnvConfig, env_problems

        config = TrainConfig(env=EnvConfig(name="plain_lake"))
        config.env.plain_lake.side = 3
        check_config(config)
        print(json.dumps({"problems": env_problems(config.env)}))
        """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"problems": []}
