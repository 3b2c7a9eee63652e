"""Rows of an embedding table for an unbounded stream of ids: admitted after k sightings, reused when idle.

A stream brings new users and ads every hour; a table with a row per id ever seen grows without bound, and a
hashed table (:func:`sparkdl_train.models.vocabulary.hashed_ids`) makes frequent ids share rows with everything
else. :class:`DynamicIds` keeps ``capacity`` rows (row 0 is shared by every id without a row of its own):

- **admission**: an id gets a row once it was seen ``admit_after`` times. Ids not admitted are counted in a
  count-min sketch of fixed size (``sketch_width`` x ``sketch_depth`` counters, raised conservatively: it may
  over-count an id by the collisions of its cells, never under-count), so ids seen once cost no memory each;
- **eviction**: when the table is full, a newly admitted id takes the row of the id seen least recently, if that
  one was not seen for ``min_idle`` observations (steps); otherwise it waits (it stays in the sketch);
- **decay**: every ``decay_every`` steps the sketch's counts are halved, so old sightings fade.

Memory is ``capacity`` keys and step stamps plus the sketch, whatever the number of distinct ids. Everything is
numpy on plain arrays (:meth:`state` / :meth:`from_state` for a checkpoint), no Spark: a stream's driver observes
each micro-batch's ids, resets the rows :meth:`observe` reports as reassigned, and maps the batch with
:meth:`lookup` (the same mapping on every executor: it travels as these arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.id_map import lookup

_MULTIPLIERS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                         0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9], dtype=np.uint64)
EMPTY = np.iinfo(np.int64).min  # a free row's key


@dataclass
class Observed:
    """What one step changed: ids given a row (and which), and rows taken from an idle id (reset them)."""

    admitted: np.ndarray  # the ids admitted this step
    rows: np.ndarray  # their rows
    reassigned: np.ndarray  # rows that belonged to an evicted id before (their weights are stale)
    waiting: int  # ids past the threshold that found no row (the table full of recently seen ids)


class DynamicIds:
    def __init__(self, capacity: int, admit_after: int = 2, min_idle: int = 1, sketch_width: int = 1 << 16,
                 sketch_depth: int = 4, decay_every: int = 0):
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2 (row 0 is the shared row), got {capacity}")
        if admit_after < 1 or min_idle < 0 or sketch_width < 1 or not 1 <= sketch_depth <= len(_MULTIPLIERS):
            raise ValueError(f"admit_after >= 1, min_idle >= 0, sketch_width >= 1 and 1 <= sketch_depth <= "
                             f"{len(_MULTIPLIERS)}; got {admit_after}, {min_idle}, {sketch_width}, {sketch_depth}")
        self.capacity, self.admit_after, self.min_idle = capacity, admit_after, min_idle
        self.decay_every = decay_every
        self.keys = np.full(capacity, EMPTY, np.int64)  # the id holding each row (row 0: never one)
        self.last_seen = np.full(capacity, -1, np.int64)  # the step each row's id was last seen
        self.sketch = np.zeros((sketch_depth, sketch_width), np.int32)
        self.step = 0
        self._index()

    # -- lookups -----------------------------------------------------------------------------------
    def _index(self) -> None:
        held = np.nonzero(self.keys != EMPTY)[0]
        order = np.argsort(self.keys[held], kind="stable")
        self._sorted_keys, self._sorted_rows = self.keys[held][order], held[order]

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row (0: none of its own), same shape as ``ids``."""
        return lookup(self._sorted_keys, self._sorted_rows, ids)

    @property
    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """The held ids, sorted, and their rows: what the executors map a batch with (:mod:`sparkdl_train.data.id_map`)."""
        return self._sorted_keys, self._sorted_rows

    @property
    def size(self) -> int:
        """Ids holding a row."""
        return len(self._sorted_keys)

    @property
    def max_nbytes(self) -> int:
        """What :attr:`nbytes` is once every row is held: the bound, whatever the stream."""
        return int(self.keys.nbytes + self.last_seen.nbytes + self.sketch.nbytes + 2 * 8 * (self.capacity - 1))

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.last_seen.nbytes + self.sketch.nbytes + self._sorted_keys.nbytes + self._sorted_rows.nbytes)

    # -- the sketch --------------------------------------------------------------------------------
    def _cells(self, ids: np.ndarray) -> np.ndarray:
        """The sketch column of each id in each row: ``(depth, n)``."""
        with np.errstate(over="ignore"):
            h = ids.astype(np.int64).view(np.uint64)[None, :] * _MULTIPLIERS[: self.sketch.shape[0], None]
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(32)
        return (h % np.uint64(self.sketch.shape[1])).astype(np.int64)

    def _count(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Add ``counts`` to ``ids``' cells; returns each id's estimated total (the minimum of its cells)."""
        cells = self._cells(ids)
        depth = np.broadcast_to(np.arange(self.sketch.shape[0])[:, None], cells.shape)
        # conservative update: each cell raised only as far as the id's new estimate (fewer over-counts than adding
        # to every cell; still never fewer than the id's true count)
        target = (self.sketch[depth, cells].min(axis=0) + counts).astype(np.int32)
        np.maximum.at(self.sketch, (depth, cells), np.broadcast_to(target, cells.shape))
        return self.sketch[depth, cells].min(axis=0)

    # -- a step ------------------------------------------------------------------------------------
    def observe(self, ids: np.ndarray) -> Observed:
        """One step's ids (a micro-batch's, any shape, repeats counted): refresh the ids that hold rows, count
        the others, admit those past ``admit_after``, evicting the least recently seen idle ids when full."""
        values, counts = np.unique(np.asarray(ids, np.int64).reshape(-1), return_counts=True)
        return self.observe_counts(values, counts)

    def observe_counts(self, values: np.ndarray, counts: np.ndarray) -> Observed:
        """:meth:`observe` for ids already counted: distinct ``values`` seen ``counts`` times each this step (what
        a Spark ``groupBy(id).count()`` of a micro-batch gives)."""
        values, counts = np.asarray(values, np.int64).reshape(-1), np.asarray(counts, np.int64).reshape(-1)
        if values.shape != counts.shape:
            raise ValueError(f"values and counts differ in length: {values.shape} and {counts.shape}")
        if len(values) != len(np.unique(values)):
            raise ValueError("values must be distinct (count each id once, with its number of sightings)")
        self.step += 1
        if self.decay_every and self.step % self.decay_every == 0:
            self.sketch >>= 1
        rows = self.lookup(values)
        held = rows > 0
        self.last_seen[rows[held]] = self.step
        new, new_counts = values[~held], counts[~held]
        empty = np.zeros(0, np.int64)
        if not len(new):
            return Observed(empty, empty, empty, 0)
        total = self._count(new, new_counts)
        ready = total >= self.admit_after
        candidates, seen = new[ready], total[ready]
        if not len(candidates):
            return Observed(empty, empty, empty, 0)
        candidates = candidates[np.argsort(-seen, kind="stable")]  # the most seen first
        free = np.nonzero(self.keys[1:] == EMPTY)[0] + 1
        # rows whose id was not seen in this step nor in the min_idle steps before it
        idle_rows = np.nonzero((self.keys[1:] != EMPTY) & (self.last_seen[1:] < self.step - self.min_idle))[0] + 1
        idle_rows = idle_rows[np.argsort(self.last_seen[idle_rows], kind="stable")]  # least recently seen first
        take = min(len(candidates), len(free) + len(idle_rows))
        given = np.concatenate([free, idle_rows])[:take]
        reassigned = given[self.keys[given] != EMPTY]
        self.keys[given] = candidates[:take]
        self.last_seen[given] = self.step
        if take:
            self._index()
        return Observed(candidates[:take], given.astype(np.int64), reassigned.astype(np.int64), len(candidates) - take)

    # -- checkpoint ------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        return {"keys": self.keys.copy(), "last_seen": self.last_seen.copy(), "sketch": self.sketch.copy(),
                "meta": np.array([self.step, self.admit_after, self.min_idle, self.decay_every], np.int64)}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> DynamicIds:
        step, admit_after, min_idle, decay_every = (int(v) for v in state["meta"])
        depth, width = state["sketch"].shape
        self = cls(len(state["keys"]), admit_after, min_idle, width, depth, decay_every)
        self.keys, self.last_seen, self.sketch, self.step = (state["keys"].copy(), state["last_seen"].copy(),
                                                            state["sketch"].copy(), step)
        self._index()
        return self
