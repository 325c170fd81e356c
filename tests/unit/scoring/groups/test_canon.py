from __future__ import annotations

from grm_service.scoring.groups.canon import (
    SEED_MASK,
    candidates,
    content_digest,
    derive_seed,
    group_digest,
)
from grm_service.scoring.models import ScoreItem


def item(id_: str, completion: str, image: str | list[str] | None = None) -> ScoreItem:
    return ScoreItem(id=id_, prompt="p", completion=completion, image=image)


def test_candidates_are_distinct_contents_in_digest_order_whatever_the_input_order() -> None:
    items = [item("x", "b"), item("y", "a"), item("z", "b")]
    found = candidates(items)
    assert [c.digest for c in found] == sorted(c.digest for c in found)
    assert candidates(items[::-1]) == found
    same = next(c for c in found if c.completion == "b")
    assert same.ids == ("x", "z")  # identical completions: one candidate, judged once


def test_the_digest_is_of_what_is_judged_completion_and_frames() -> None:
    assert content_digest(item("a", "t")) == content_digest(item("b", "t"))
    assert content_digest(item("a", "t")) != content_digest(item("a", "t", "data:x"))
    assert content_digest(item("a", "t", ["f1", "f2"])) != content_digest(
        item("a", "t", ["f2", "f1"]))


def test_seeds_derive_from_the_base_seed_and_the_ordered_digests() -> None:
    seed = derive_seed(42, "pairwise", ["a", "b"])
    assert 0 <= seed <= SEED_MASK and seed == derive_seed(42, "pairwise", ["a", "b"])
    assert seed != derive_seed(42, "pairwise", ["b", "a"])
    assert seed != derive_seed(43, "pairwise", ["a", "b"])
    assert seed != derive_seed(42, "listwise", ["a", "b"])


def test_a_group_key_names_the_asker_scorer_options_sampling_and_group() -> None:
    base = group_digest("k1", "pairwise", {"strategy": "circular"}, {}, "g")
    assert base == group_digest("k1", "pairwise", {"strategy": "circular"}, {}, "g")
    others = [group_digest("k2", "pairwise", {"strategy": "circular"}, {}, "g"),
              group_digest("k1", "listwise", {"strategy": "circular"}, {}, "g"),
              group_digest("k1", "pairwise", {"strategy": "all_pairs"}, {}, "g"),
              group_digest("k1", "pairwise", {"strategy": "circular"}, {"seed": 1}, "g"),
              group_digest("k1", "pairwise", {"strategy": "circular"}, {}, "h")]
    assert base not in others and len(set(others)) == len(others)
