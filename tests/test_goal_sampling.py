"""Goal samplers on hand-built competence histories and in the real environment."""

import math
import random
from collections import Counter

import pytest
import yaml

from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.config import ConfigError, GoalsConfig, ModelConfig, load_config
from sacglam_core.envs import EnvConfig, VectorPlayground, catalog
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.goal_sampling import GoalSampler, grammar_bucket, grammar_buckets, learning_progress
from sacglam_core.models.loading import load_tokenizer
from sacglam_core.trajectories import EpisodeRecorder

ENV = EnvConfig(simplified=True, n_objects=6, max_steps=7)


def goals_of(bucket: str, n: int) -> list[str]:
    goals = catalog()
    return [g for g in goals.goals("train", simplified=True) if grammar_bucket(goals.parse(g)) == bucket][:n]


def sampler_with(history: dict[str, list[float]], **settings) -> GoalSampler:
    """A learning-progress sampler that knows 2 goals of each bucket of `history` and saw those outcomes."""
    sampler = GoalSampler(GoalsConfig(sampler="learning_progress", **settings), ENV, seed=0)
    for bucket, outcomes in history.items():
        first, second = goals_of(bucket, 2)
        sampler.observe(first, False, [first, second])  # the partner describes both goals
        sampler.outcomes[bucket].clear()
        for outcome in outcomes:
            sampler.observe(first, bool(outcome), [])
    return sampler


HISTORY = {  # improving, mastered, impossible
    "grasp animal": [0.0] * 10 + [1.0] * 10,
    "grasp plant": [1.0] * 20,
    "grow animal": [0.0] * 20,
}


def test_learning_progress_is_the_change_between_the_window_halves():
    assert learning_progress([0, 0, 1, 1]) == 1.0
    assert learning_progress([1, 1, 0, 0]) == 1.0  # absolute: forgetting is progress to make again
    assert learning_progress([1, 0, 1, 0]) == 0.0
    assert learning_progress([1]) == 0.0 and learning_progress([]) == 0.0


def test_the_improving_bucket_takes_the_draws_a_mastered_and_an_impossible_one_lose_their_share():
    greedy = sampler_with(HISTORY, epsilon=0.0, window=20)
    draws = Counter(greedy.bucket_name(greedy.next_goal()) for _ in range(500))
    assert draws == {"grasp animal": 500}
    mixed = sampler_with(HISTORY, epsilon=0.3, window=20)
    draws = Counter(mixed.bucket_name(mixed.next_goal()) for _ in range(3000))
    # epsilon draws spread over the 3 buckets: each gets 0.1 of all draws from them
    assert draws["grasp animal"] / 3000 == pytest.approx(0.7 + 0.1, abs=0.03)
    assert draws["grasp plant"] / 3000 == pytest.approx(0.1, abs=0.02)
    assert draws["grow animal"] / 3000 == pytest.approx(0.1, abs=0.02)
    stats = mixed.statistics()
    assert stats["goals_known"] == 6 and stats["lp/grasp animal"] == 1.0 and stats["lp/grasp plant"] == 0.0
    assert stats["share/grasp animal"] == pytest.approx(draws["grasp animal"] / 3000)


def test_uniform_draws_are_over_buckets_so_a_small_bucket_is_not_starved():
    """MAGELLAN's epsilon branch draws a bucket, not a goal: a bucket of 1 known goal beside one of 20 gets half of
    the draws while neither shows progress, and epsilon / 2 of them once the large one progresses."""
    sampler = GoalSampler(GoalsConfig(sampler="learning_progress", epsilon=0.4, window=20), ENV, seed=0)
    many, one = goals_of("grasp animal", 20), goals_of("grow animal", 1)
    sampler.observe(many[0], False, many + one)
    sampler.outcomes.clear()
    draws = Counter(sampler.bucket_name(sampler.next_goal()) for _ in range(2000))
    assert draws["grow animal"] / 2000 == pytest.approx(0.5, abs=0.04)
    for outcome in [0.0] * 10 + [1.0] * 10:
        sampler.observe(many[0], bool(outcome), [])
    draws = Counter(sampler.bucket_name(sampler.next_goal()) for _ in range(2000))
    assert draws["grow animal"] / 2000 == pytest.approx(0.2, abs=0.03)


def test_competence_buckets_group_the_known_goals_by_success():
    sampler = GoalSampler(GoalsConfig(sampler="learning_progress", buckets="competence", window=10), ENV, seed=0)
    solved, hard = goals_of("grasp animal", 1)[0], goals_of("grow animal", 1)[0]
    sampler.observe(solved, False, [solved, hard])
    for _ in range(10):
        sampler.observe(solved, True, [])
        sampler.observe(hard, False, [])
    assert sampler.bucket_name(solved) == "competence 0.80-1.00" and sampler.bucket_name(hard) == "competence 0.00-0.20"


def test_competence_bucket_shares_add_up_to_one_after_goals_change_bucket():
    """Draws made while goals sat in a level they have since left still count in the row's shares."""
    sampler = GoalSampler(GoalsConfig(sampler="learning_progress", buckets="competence", window=4), ENV, seed=0)
    first, second = goals_of("grasp animal", 2)
    sampler.observe(first, False, [first, second])
    sampler.outcomes.clear()
    for _ in range(5):
        sampler.next_goal()  # both goals at level 0.00-0.20
    for _ in range(4):
        sampler.observe(first, True, [])
        sampler.observe(second, True, [])
    stats = sampler.statistics()
    shares = {k: v for k, v in stats.items() if k.startswith("share/")}
    assert sum(shares.values()) == pytest.approx(1.0) and shares["share/competence 0.00-0.20"] == 1.0
    assert "lp/competence 0.00-0.20" not in stats  # an empty level has no learning progress


def test_user_buckets_take_the_first_pattern_a_goal_matches():
    buckets = {"red things": ("Grasp red *",), "grasping": ("Grasp *",)}
    sampler = GoalSampler(GoalsConfig(sampler="learning_progress", buckets=buckets), ENV, seed=0)
    assert sampler.bucket_of["Grasp red dog"] == "red things"
    assert sampler.bucket_of["Grasp blue dog"] == "grasping"
    assert sampler.bucket_of["Grow blue dog"] == "other"


def test_the_discovered_set_grows_only_from_the_partners_descriptions():
    sampler = GoalSampler(GoalsConfig(sampler="discovered"), ENV, seed=0)
    assert sampler.next_goal() is None  # nothing known yet: the environment draws
    sampler.observe("Grasp red dog", True, [])  # pursuing or reaching a goal does not describe it
    assert sampler.known == []
    sampler.observe("Grasp red dog", False, ["Grasp blue cat", "Grasp any cat", "Grasp any animal"])
    assert sampler.known == ["Grasp blue cat", "Grasp any cat"]  # `Grasp any animal` is a test goal
    assert {sampler.next_goal() for _ in range(50)} == {"Grasp blue cat", "Grasp any cat"}


def test_in_the_environment_every_known_goal_was_described_and_new_episodes_pursue_known_ones():
    sampler = GoalSampler(GoalsConfig(sampler="discovered"), ENV, seed=0)
    envs = VectorPlayground(8, ENV, seed=0)
    envs.goal_source = sampler.next_goal
    obs, infos = envs.reset()
    rng, described, drawn_from_known = random.Random(0), set(), []
    goals, reports = list(infos["goal"]), [[] for _ in range(8)]
    for _ in range(300):
        obs, rewards, terminated, truncated, infos = envs.step([rng.choice(a) for a in infos["possible_actions"]])
        known_at_resets = set(sampler.known)  # what the sampler knew when this step's finished environments reset
        for i in range(8):
            if not (terminated[i] or truncated[i]):
                reports[i] += infos["achieved_goals"][i]
                continue
            reports[i] += infos["final_info"][i]["achieved_goals"]
            sampler.observe(goals[i], bool(terminated[i]), reports[i])
            described.update(reports[i])
            if known_at_resets:
                drawn_from_known.append(infos["goal"][i] in known_at_resets)
            reports[i], goals[i] = [], infos["goal"][i]
    assert sampler.known and set(sampler.known) <= described
    assert len(drawn_from_known) > 50 and all(drawn_from_known)


def test_descriptions_made_before_a_rollout_boundary_reach_the_sampler(tiny_models):
    """PPO cuts open episodes at each rollout's end: the finished episode still carries every goal the partner
    described since it began, which is what the trainer gives the sampler."""
    tokens = PromptTokens(load_tokenizer(ModelConfig(str(tiny_models["tiny-t5"]))))
    envs, recorder, rng = VectorPlayground(4, ENV, seed=0), EpisodeRecorder(tokens), random.Random(0)
    obs, infos = envs.reset()
    recorder.reset(infos["goal"], obs, infos["possible_actions"])
    reported, finished, before_a_cut = [[] for _ in range(4)], 0, 0
    for step in range(300):
        candidates = recorder.candidates()
        choices = [rng.randrange(len(c)) for c in candidates]
        obs, rewards, terminated, truncated, infos = envs.step(
            [ACTION_VOCABULARY[c[k]] for c, k in zip(candidates, choices)]
        )
        ended = [i for i in range(4) if terminated[i] or truncated[i]]
        for i in range(4):
            reported[i] += infos["final_info"][i]["achieved_goals"] if i in ended else infos["achieved_goals"][i]
        for i, episode in zip(ended, recorder.step(choices, rewards, terminated, truncated, obs, infos), strict=True):
            assert episode.described == reported[i]
            finished, before_a_cut, reported[i] = finished + 1, before_a_cut + len(episode.described_before), []
        if step % 3 == 2:
            recorder.cut()
    assert finished > 100 and before_a_cut > 20


def test_a_sampler_resumed_from_its_state_draws_what_the_uninterrupted_one_draws():
    first = sampler_with(HISTORY, epsilon=0.3, window=20)
    [first.next_goal() for _ in range(7)]
    state = yaml.safe_load(yaml.safe_dump(first.state_dict()))  # plain data, as a checkpoint holds it
    second = GoalSampler(first.config, ENV, seed=99)
    second.load_state_dict(state)
    assert [first.next_goal() for _ in range(50)] == [second.next_goal() for _ in range(50)]
    assert first.statistics() == second.statistics()


MAGELLAN = {"sampler": "learning_progress", "known": "train", "epsilon_decay": 274}  # the autotelic experiment's


def test_with_magellans_settings_every_train_goal_can_be_drawn_before_any_description():
    sampler = GoalSampler(GoalsConfig(**MAGELLAN), ENV, seed=0)
    train = catalog().goals("train", simplified=True)
    assert sorted(sampler.known) == sorted(train) and set(sampler.buckets()) == set(grammar_buckets(ENV))
    draws = [sampler.next_goal() for _ in range(4000)]
    assert set(draws) == set(train)
    shares = Counter(sampler.bucket_name(g) for g in draws)  # epsilon 1 and no progress: buckets drawn uniformly
    assert all(count / 4000 == pytest.approx(1 / 8, abs=0.02) for count in shares.values())


def test_magellans_epsilon_decays_exponentially_from_1_to_0_2_with_the_episodes_observed():
    sampler = GoalSampler(GoalsConfig(**MAGELLAN), ENV, seed=0)
    epsilon = []
    for _ in range(10 * 274 + 1):
        epsilon.append(sampler.epsilon)
        sampler.observe(sampler.train[0], False, [])
    assert epsilon[0] == 1.0 and epsilon[274] == pytest.approx(0.2 + 0.8 / math.e)
    assert epsilon[2740] == pytest.approx(0.2, abs=4e-5) and min(epsilon) > 0.2
    assert all(e == pytest.approx(0.2 + 0.8 * math.exp(-n / 274)) for n, e in enumerate(epsilon))
    assert all(earlier > later for earlier, later in zip(epsilon, epsilon[1:]))


def test_draws_take_the_scheduled_epsilon_and_drawing_does_not_move_the_clock():
    sampler = sampler_with(HISTORY, window=20, epsilon_decay=40)  # 63 episodes observed
    epsilon = 0.2 + 0.8 * math.exp(-63 / 40)
    assert sampler.episodes == 63 and sampler.epsilon == pytest.approx(epsilon)
    draws = Counter(sampler.bucket_name(sampler.next_goal()) for _ in range(3000))
    assert sampler.epsilon == pytest.approx(epsilon)
    assert draws["grasp animal"] / 3000 == pytest.approx(1 - epsilon + epsilon / 3, abs=0.03)  # 0.2 would give 0.87


GOALS = goals_of("grasp animal", 3) + goals_of("grow animal", 3) + goals_of("grasp supply", 2)


def scripted_draws(config: GoalsConfig) -> list[int | None]:
    """A sampler's draws (indices in GOALS) over 30 episodes that describe, succeed and fail in a fixed pattern."""
    sampler = GoalSampler(config, ENV, seed=5)
    draws = [sampler.next_goal()]
    for episode in range(30):
        goal = GOALS[episode % 8]
        described = [GOALS[episode * 3 % 8]] if episode % 4 != 3 else []
        sampler.observe(goal, episode % 3 == 0 or goal.startswith("Grasp"), described)
        draws.append(sampler.next_goal())
    return [None if g is None else GOALS.index(g) for g in draws]


def test_the_defaults_draw_what_the_samplers_drew_before_magellans_settings_existed():
    """Recorded at 3935213, before `known`, `epsilon_start` and `epsilon_decay`: the finished runs of
    `autotelic_mini` keep their meaning (their run directories, the fingerprints, are in test_workflow)."""
    explicit = GoalsConfig(sampler="learning_progress", known="discovered", epsilon_start=1.0, epsilon_decay=None)
    assert explicit == GoalsConfig(sampler="learning_progress")
    assert scripted_draws(explicit) == [None, 0, 0, 0, 0, 3, 3, 3, 4, 0, 3, 3, 3, 6, 4, 3, 3, 6, 7, 4, 4, 0, 4, 4, 3,
                                        3, 2, 4, 2, 3, 7]  # fmt: skip
    assert scripted_draws(GoalsConfig(sampler="discovered")) == [None, 0, 3, 6, 6, 0, 4, 3, 2, 0, 3, 0, 6, 4, 3, 4, 7,
                                                                 0, 7, 3, 0, 2, 3, 4, 6, 3, 4, 3, 0, 3, 7]  # fmt: skip


def test_magellans_sampler_resumes_at_its_place_in_the_schedule():
    first = sampler_with(HISTORY, window=20, known="train", epsilon_decay=40)
    [first.next_goal() for _ in range(7)]
    state = yaml.safe_load(yaml.safe_dump(first.state_dict()))
    second = GoalSampler(first.config, ENV, seed=99)
    second.load_state_dict(state)
    assert second.episodes == 63 and second.epsilon == first.epsilon
    assert [first.next_goal() for _ in range(50)] == [second.next_goal() for _ in range(50)]
    for sampler in (first, second):
        sampler.observe(GOALS[0], True, [])
    assert first.epsilon == second.epsilon < GoalSampler(first.config, ENV, seed=0).epsilon
    del state["episodes"]  # a checkpoint written before the schedule: its epsilon was constant
    second.load_state_dict(state)
    assert second.episodes == 0


def test_grammar_buckets_are_goal_type_and_category():
    assert grammar_buckets(ENV) == sorted(set(grammar_buckets(ENV)))
    assert "grasp animal" in grammar_buckets(ENV) and "grow animal" in grammar_buckets(ENV)
    assert grammar_bucket(catalog().parse("Grasp any red thing")) == "grasp thing"
    assert grammar_bucket(catalog().parse("Grow any green thing")) == "grow living_thing"


@pytest.mark.parametrize(
    "goals, message",
    [
        ({"sampler": "curious"}, "goals.sampler: Input should be 'uniform', 'discovered' or 'learning_progress'"),
        ({"sampler": "learning_progress", "epsilon": 1.5}, "goals.epsilon: Input should be less than or equal to 1"),
        ({"sampler": "learning_progress", "epsilon": -0.1}, "goals.epsilon: Input should be greater than or equal"),
        ({"sampler": "learning_progress", "buckets": {"birds": ["Grasp * bird"]}}, "goals.buckets.birds: ['Grasp * "
         "bird'] match no train goal"),
        ({"sampler": "discovered", "initial": ["Grasp any animal"]}, "goals.initial: ['Grasp any animal'] are not "
         "train goals"),
        ({"initial": ["Grasp red dog"]}, "goals.initial is for the samplers that know goals"),
        ({"sampler": "learning_progress", "window": 1}, "goals.window: Input should be greater than or equal to 2"),
        ({"sampler": "learning_progress", "buckets": "competence", "competence_levels": 1},
         "goals.competence_levels: Input should be greater than or equal to 2"),
        ({"sampler": "learning_progress", "competence_levels": 3}, "goals.competence_levels: a setting of buckets: "
         "competence"),
        ({"sampler": "discovered", "epsilon": 0.5, "window": 40}, "goals.epsilon, goals.window: settings of sampler "
         "learning_progress, not discovered"),
        ({"sampler": "learning_progress", "buckets": {"other": ["Grasp *"]}}, "goals.buckets.other: `other` names"),
        ({"sampler": "learning_progress", "buckets": {"grasping": ["Grasp *"], "grasping dogs": ["Grasp * dog"]}},
         "goals.buckets.grasping dogs: every goal ['Grasp * dog'] match joins an earlier bucket"),
        ({"sampler": "learning_progress", "known": "all"}, "goals.known: Input should be 'discovered' or 'train'"),
        ({"sampler": "discovered", "known": "train"}, "goals.known: settings of sampler learning_progress, not "
         "discovered"),
        ({"epsilon_decay": 274}, "goals.epsilon_decay: settings of sampler learning_progress, not uniform"),
        ({"sampler": "learning_progress", "known": "train", "initial": ["Grasp red dog"]}, "goals.initial: known: "
         "train knows every train goal from the start"),
        ({"sampler": "learning_progress", "epsilon_decay": 0}, "goals.epsilon_decay: Input should be greater than 0"),
        ({"sampler": "learning_progress", "epsilon_start": 0.5}, "goals.epsilon_start: a setting of "
         "goals.epsilon_decay (without it epsilon stays goals.epsilon)"),
        ({"sampler": "learning_progress", "epsilon_decay": 274, "epsilon_start": 0.1}, "goals.epsilon_start 0.1 is "
         "below goals.epsilon 0.2: epsilon decays from epsilon_start to epsilon"),
    ],
)  # fmt: skip
def test_bad_goal_settings_are_one_line_naming_the_file_and_key(tmp_path, goals, message):
    """(yaml.safe_dump sorts a mapping's keys: buckets are listed here in their order in the file.)"""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"algorithm": "sac", "model": {"name_or_path": "x"}, "env": {"simplified": True},
                                    "goals": goals}))  # fmt: skip
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert message in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_sampler_that_learns_goals_from_the_partner_refuses_the_test_split(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"algorithm": "sac", "model": {"name_or_path": "x"}, "env": {"split": "test"},
                                    "goals": {"sampler": "discovered"}}))  # fmt: skip
    with pytest.raises(ConfigError, match="goals.sampler discovered learns the goals the partner describes, train "
                                          "goals only: env.split must be train"):  # fmt: skip
        load_config(path)
    path.write_text(yaml.safe_dump({"algorithm": "sac", "model": {"name_or_path": "x"}, "env": {"split": "test"},
                                    "goals": MAGELLAN}))  # fmt: skip
    with pytest.raises(ConfigError, match="goals.sampler learning_progress draws among the train goals, train goals "
                                          "only: env.split must be train"):  # fmt: skip
        load_config(path)
