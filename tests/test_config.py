"""Tests for zmq_rl.config: defaults, derived sizes, the staleness valve, validation.

Ports the reference module's ``config_default_is_valid_and_derives_updates``,
``config_rejects_bad_values`` and ``config_vtrace_fields_validate`` as behaviour.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from zmq_rl.config import (
    ActorConfig,
    ConfigError,
    LearnerConfig,
    PolicyConfig,
    PPOConfig,
    replace,
)
from zmq_rl.wire.valve import ActorThrottle

# The reference's default AsyncActorLearnerConfig, expressed with one env per actor.
REF = dict(num_actors=4, num_steps=256, num_envs=1, total_env_steps=200_000)


def reference_config(**changes) -> LearnerConfig:
    return LearnerConfig(**{**REF, **changes})


def throttle_of(cfg: LearnerConfig, base_version: int = 0) -> ActorThrottle:
    """The valve an actor of ``cfg``'s run builds from its welcome's settings."""
    from gymnasium import spaces

    from zmq_rl.learner.loop import run_settings

    box = spaces.Box(-1.0, 1.0, (4,))
    settings = run_settings(cfg, box, spaces.Discrete(2), PolicyConfig())
    return ActorThrottle.from_settings(settings, base_version)


# -- defaults and derivations ------------------------------------------------------------


def test_defaults_validate_and_chain():
    for cfg in (LearnerConfig(), PPOConfig(), PolicyConfig(), ActorConfig()):
        assert cfg.validate() is cfg
    learner = LearnerConfig()
    assert learner.broadcast_every == 1
    assert learner.max_lead_steps == 0
    # V-trace is off by default and its clips default to the IMPALA values.
    assert learner.use_vtrace is False
    assert (learner.vtrace_rho_bar, learner.vtrace_c_bar) == (1.0, 1.0)
    assert learner.experience_port() == learner.port + 1
    assert learner.weights_port() == learner.port + 2


def test_reference_derivations():
    cfg = reference_config().validate()
    assert cfg.nominal_slots() == 4
    assert cfg.num_updates() == 200_000 // (256 * 4) == 195
    assert cfg.steps_per_broadcast() == 256
    assert cfg.effective_max_lead_steps() == 2 * 256
    # An explicit lead budget is used as given; broadcast_every scales the default.
    assert reference_config(max_lead_steps=300).effective_max_lead_steps() == 300
    assert reference_config(broadcast_every=3).effective_max_lead_steps() == 2 * 3 * 256


def test_num_updates_counts_every_env_slot():
    cfg = LearnerConfig(num_actors=2, num_steps=8, num_envs=3, total_env_steps=100)
    assert cfg.num_updates() == 100 // (8 * 2 * 3) == 2


def test_reference_throttle_pause_points():
    throttle = throttle_of(reference_config())
    assert throttle == ActorThrottle(steps_per_broadcast=256, max_lead_steps=512, base_version=0)
    # The lead budget is cumulative: version v proves v * 256 steps consumed.
    assert not throttle.should_pause(511, 0)
    assert throttle.should_pause(512, 0)
    assert not throttle.should_pause(512, 1)  # v1: budget is now 768
    assert not throttle.should_pause(767, 1)
    assert throttle.should_pause(768, 1)
    assert throttle.should_pause(10_000, 1)


def test_under_rows_batches_a_version_never_says_the_registration_is_gone():
    """docs/protocol.md 5.5, rule (2) of the pause for the link: a learner of rows batches
    says so (the welcome's informational ``batch_rows``) and uses slots unevenly, so a
    version proves nothing about one actor's slots; the S/L budget of an actor without
    grants is still the welcome's."""
    from gymnasium import spaces

    from zmq_rl.learner.settings import batch_plan, run_settings

    cfg = reference_config().validate()
    box = spaces.Box(-1.0, 1.0, (4,))
    plan = batch_plan(cfg, 1, recurrent=False)
    rows = run_settings(cfg, box, spaces.Discrete(2), PolicyConfig(), batch=plan)
    assert rows.batch_rows == 4 * 256 and "batch_rows" in rows.to_map()
    assert "batch_rows" not in run_settings(cfg, box, spaces.Discrete(2), PolicyConfig()).to_map()
    valve = ActorThrottle.from_settings(rows, base_version=0)
    assert throttle_of(cfg).impossible_for_member(version=1, steps_sent=255)
    assert not valve.impossible_for_member(version=1, steps_sent=255)
    assert valve.budget(1) == rows.steps_per_broadcast + rows.max_lead_steps


def test_disabled_throttle_never_pauses():
    disabled = ActorThrottle.disabled()
    assert disabled.max_lead_steps == 0
    for steps in (0, 1, 512, 2**62):
        assert not disabled.should_pause(steps, 0)
        assert not disabled.should_pause(steps, 99)


def test_late_joiner_budget_counts_from_base_version():
    cfg = reference_config()
    spb, lead = 256, 512
    throttle = throttle_of(cfg, base_version=5)
    assert throttle.base_version == 5
    assert throttle.budget(5) == lead
    assert throttle.budget(6) == spb + lead
    assert throttle.budget(7) == 2 * spb + lead
    # The weights in a late joiner's welcome are older than its base version: the
    # learner has consumed nothing of it yet, so the budget is just the lead.
    for version in (0, 3, 4):
        assert throttle.budget(version) == lead
    assert not throttle.should_pause(lead - 1, 4)
    assert throttle.should_pause(lead, 4)
    assert throttle.should_pause(lead + spb, 6)
    assert not throttle.should_pause(lead + spb, 7)


# -- rejected values ---------------------------------------------------------------------


def assert_rejected(make, field: str, shown: str):
    with pytest.raises(ConfigError) as info:
        make().validate()
    assert info.value.field == field
    assert shown in str(info.value), f"{str(info.value)!r} does not show {shown!r}"
    return info.value


@pytest.mark.parametrize(
    ("changes", "field", "shown"),
    [
        ({"num_actors": 0}, "num_actors", "0"),
        ({"num_steps": 0}, "num_steps", "0"),
        ({"broadcast_every": 0}, "broadcast_every", "0"),
        ({"total_env_steps": 10}, "total_env_steps", "10"),
        ({"total_env_steps": 1023}, "total_env_steps", "1023"),
        ({"gamma": 0.0}, "gamma", "0.0"),
        ({"gamma": 1.5}, "gamma", "1.5"),
        ({"gamma": -0.5}, "gamma", "-0.5"),
        ({"gae_lambda": 0.0}, "gae_lambda", "0.0"),
        ({"gae_lambda": 1.5}, "gae_lambda", "1.5"),
        ({"vtrace_lambda": 0.0}, "vtrace_lambda", "0.0"),
        ({"vtrace_lambda": 1.01}, "vtrace_lambda", "1.01"),
        ({"vtrace_rho_bar": 0.0}, "vtrace_rho_bar", "0.0"),
        ({"vtrace_rho_bar": -1.0}, "vtrace_rho_bar", "-1.0"),
        ({"vtrace_c_bar": 0.0}, "vtrace_c_bar", "0.0"),
        ({"vtrace_c_bar": -1.0}, "vtrace_c_bar", "-1.0"),
        # A lead budget tighter than one broadcast cycle would deadlock the learner.
        ({"max_lead_steps": 255}, "max_lead_steps", "255"),
        ({"max_lead_steps": 511, "broadcast_every": 2}, "max_lead_steps", "511"),
        ({"gamma": math.nan}, "gamma", "nan"),
        ({"gamma": math.inf}, "gamma", "inf"),
        ({"num_actors": True}, "num_actors", "True"),
        ({"num_steps": 2.0}, "num_steps", "2.0"),
        ({"num_actors": -3}, "num_actors", "-3"),
        ({"num_envs": 0}, "num_envs", "0"),
        ({"fragment_length": 0}, "fragment_length", "0"),
        ({"starvation_timeout": 0.0}, "starvation_timeout", "0.0"),
        ({"port": 65534}, "port", "65534"),
        ({"env_id": ""}, "env_id", "''"),
        ({"max_message_bytes": 10}, "max_message_bytes", "10"),
    ],
)
def test_learner_config_rejects(changes, field, shown):
    err = assert_rejected(lambda: reference_config(**changes), field, shown)
    assert err.value == changes[field] or (isinstance(err.value, float) and math.isnan(err.value))


@pytest.mark.parametrize("use_vtrace", [False, True])
@pytest.mark.parametrize("field", ["vtrace_rho_bar", "vtrace_c_bar"])
def test_vtrace_clips_checked_even_when_vtrace_is_off(use_vtrace, field):
    for bad in (0.0, -1.0):
        assert_rejected(
            lambda bad=bad: reference_config(use_vtrace=use_vtrace, **{field: bad}), field, str(bad)
        )


def test_vtrace_with_default_and_custom_clips_validates():
    reference_config(use_vtrace=True).validate()
    cfg = replace(reference_config(), use_vtrace=True, vtrace_rho_bar=0.9, vtrace_c_bar=1.1)
    assert (cfg.use_vtrace, cfg.vtrace_rho_bar, cfg.vtrace_c_bar) == (True, 0.9, 1.1)


def test_lead_budget_boundaries():
    # 0 selects the default; exactly one broadcast cycle is the tightest legal budget.
    assert reference_config(max_lead_steps=0).validate().effective_max_lead_steps() == 512
    assert reference_config(max_lead_steps=256).validate().effective_max_lead_steps() == 256
    reference_config(max_lead_steps=512, broadcast_every=2).validate()


def test_total_env_steps_boundary_is_one_update():
    assert reference_config(total_env_steps=1024).validate().num_updates() == 1
    assert LearnerConfig(num_actors=2, num_steps=8, num_envs=3, total_env_steps=48).validate()
    assert_rejected(
        lambda: LearnerConfig(num_actors=2, num_steps=8, num_envs=3, total_env_steps=47),
        "total_env_steps",
        "47",
    )


INT_FIELDS = [
    f.name
    for f in dataclasses.fields(LearnerConfig)
    if f.type in ("int", int) and f.name not in ("port",)
]


@pytest.mark.parametrize("field", INT_FIELDS)
def test_bool_is_not_an_int_for_any_learner_int_field(field):
    assert_rejected(lambda: reference_config(**{field: True}), field, "True")


def test_bool_port_is_rejected():
    assert_rejected(lambda: reference_config(port=True), "port", "True")


def test_replace_validates():
    with pytest.raises(ConfigError) as info:
        replace(reference_config(), num_steps=0)
    assert info.value.field == "num_steps"


# -- PPOConfig, ActorConfig, PolicyConfig -----------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "shown"),
    [
        ({"learning_rate": 0.0}, "learning_rate", "0.0"),
        ({"learning_rate": math.nan}, "learning_rate", "nan"),
        ({"num_epochs": 0}, "num_epochs", "0"),
        ({"num_epochs": True}, "num_epochs", "True"),
        ({"minibatch_size": 0}, "minibatch_size", "0"),
        ({"clip_range": -0.2}, "clip_range", "-0.2"),
        ({"max_grad_norm": 0.0}, "max_grad_norm", "0.0"),
        ({"adam_eps": 0.0}, "adam_eps", "0.0"),
        ({"vf_coef": -0.5}, "vf_coef", "-0.5"),
        ({"ent_coef": -0.01}, "ent_coef", "-0.01"),
        ({"target_kl": -1.0}, "target_kl", "-1.0"),
        ({"ent_coef": math.inf}, "ent_coef", "inf"),
    ],
)
def test_ppo_config_rejects(changes, field, shown):
    assert_rejected(lambda: PPOConfig(**changes), field, shown)


@pytest.mark.parametrize(
    ("changes", "field", "shown"),
    [
        ({"learner": ""}, "learner", "''"),
        ({"learner": "   "}, "learner", "'   '"),
        ({"num_envs": -1}, "num_envs", "-1"),
        ({"num_envs": True}, "num_envs", "True"),
        ({"seed": -2}, "seed", "-2"),
        ({"actor_id": -2}, "actor_id", "-2"),
        ({"actor_id": False}, "actor_id", "False"),
        ({"register_timeout": 0.0}, "register_timeout", "0.0"),
        ({"register_timeout": math.nan}, "register_timeout", "nan"),
        ({"torch_threads": 0}, "torch_threads", "0"),
    ],
)
def test_actor_config_rejects(changes, field, shown):
    assert_rejected(lambda: ActorConfig(**changes), field, shown)


def test_actor_config_sentinels_are_valid():
    cfg = ActorConfig(learner="tcp://10.0.0.1:6000", num_envs=0, seed=-1, actor_id=-1).validate()
    assert (cfg.num_envs, cfg.seed, cfg.actor_id) == (0, -1, -1)


@pytest.mark.parametrize(
    ("changes", "field", "shown"),
    [
        ({"hidden_sizes": ()}, "hidden_sizes", "()"),
        ({"hidden_sizes": (64, 0)}, "hidden_sizes", "(64, 0)"),
        ({"hidden_sizes": (True,)}, "hidden_sizes", "(True,)"),
        ({"hidden_sizes": (8.0,)}, "hidden_sizes", "(8.0,)"),
        ({"activation": "gelu"}, "activation", "'gelu'"),
        ({"log_std_init": math.inf}, "log_std_init", "inf"),
        ({"policy_type": "rnn"}, "policy_type", "'rnn'"),
    ],
)
def test_policy_config_rejects(changes, field, shown):
    assert_rejected(lambda: PolicyConfig(**changes), field, shown)
