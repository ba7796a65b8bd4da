"""Random identifiers drawn during a run come from the cell's entropy (run/random_ids.py)."""

import uuid

from neuron_workbench.run.random_ids import drawn, entropy_drawn_from, new_entropy


def _drawn(entropy, count=3):
    with entropy_drawn_from(entropy, {}):
        return [uuid.uuid4() for _ in range(count)]


def test_each_run_of_a_cell_draws_the_same_identifiers_and_each_cell_new_ones():
    entropy = new_entropy()
    first = _drawn(entropy)
    assert first == _drawn(entropy)  # the reference's and the target's run
    assert len(set(first)) == 3 and all(u.version == 4 for u in first)
    assert set(first).isdisjoint(_drawn(new_entropy()))  # the next execution of the cell
    # outside a run, uuid4 is the standard library's again
    assert uuid.uuid4.__module__ == "uuid" and uuid.uuid4() not in first


def test_the_notebooks_own_names_for_uuid4_draw_from_the_run_and_are_put_back():
    entropy = new_entropy()
    namespace = {"uuid4": uuid.uuid4, "rebound": uuid.uuid4}
    with entropy_drawn_from(entropy, namespace):
        drawn = namespace["uuid4"]()
        namespace["rebound"] = "the cell's own"
    assert drawn == _drawn(entropy, 1)[0]
    assert namespace == {"uuid4": uuid.uuid4, "rebound": "the cell's own"}


def test_without_entropy_nothing_changes():
    namespace = {"uuid4": uuid.uuid4}
    with entropy_drawn_from(None, namespace):
        assert uuid.uuid4() != uuid.uuid4()
        assert namespace["uuid4"] is uuid.uuid4


def test_each_purpose_draws_its_own_stream_of_the_cells_entropy():
    entropy = new_entropy()

    def run(seeds_first):
        with entropy_drawn_from(entropy, {}):
            if seeds_first:
                seeds = [drawn("torch.seed", 8) for _ in range(2)]
                return seeds, uuid.uuid4()
            identifier = uuid.uuid4()
            return [drawn("torch.seed", 8) for _ in range(2)], identifier

    seeds, identifier = run(seeds_first=True)
    assert (seeds, identifier) == run(seeds_first=True) == run(seeds_first=False)
    assert seeds[0] != seeds[1]
    # outside a run: the system's bytes
    assert drawn("torch.seed", 8) != drawn("torch.seed", 8)
