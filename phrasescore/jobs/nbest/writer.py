"""What ``nbest`` writes of each scored chunk: every line with its new features, each id's
hypotheses re-ranked by ``--weights`` (the new total in the total field), or with ``--one-best``
the best hypothesis of each id (placed at the end, one line per source sentence:
:class:`OneBestLines`).

Re-ranking: each id's hypotheses are ordered by the new total ``Σ weight · feature`` (ties keep
the list's order; :func:`~phrasescore.moses.nbest.weighted_totals`), the new features entering it
with their values as written (6 significant digits), so that the totals can be recomputed from
the output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files import display_name
from phrasescore.moses.nbest import (
    NBestEntry,
    best_index,
    gap_ids,
    missing_ids_message,
    parse_features,
    weighted_totals,
    with_feature,
    with_total,
)

log = logging.getLogger(__name__)


def with_features(entries: list[NBestEntry], names: list[str], values: list) -> list[NBestEntry]:
    """``entries`` with each feature of ``names`` added after the last one (``values``: one
    column of values per name), in order."""
    for name, column in zip(names, values, strict=True):
        entries = [with_feature(e, name, float(v)) for e, v in zip(entries, column, strict=True)]
    return entries


def regroup(entries: list[NBestEntry], groups: list[list[NBestEntry]]) -> list[list[NBestEntry]]:
    """``entries`` cut into groups of the sizes of ``groups``'."""
    cut, position = [], 0
    for group in groups:
        cut.append(entries[position : position + len(group)])
        position += len(group)
    return cut


class GroupSpan(NamedTuple):
    """One sentence id's hypotheses in a chunk: what the run's :class:`ListTally` keeps of a
    group whose lines were formatted elsewhere (a worker process)."""

    id: int
    lineno: int
    """The line of its first hypothesis."""
    size: int


def spans(groups: list[list[NBestEntry]]) -> list[GroupSpan]:
    """The :class:`GroupSpan` of each group."""
    return [GroupSpan(group[0].id, group[0].lineno, len(group)) for group in groups]


class ListFormat:
    """The text of one chunk's scored groups: as they are, re-ranked by ``weights``, or the
    1-best text of each as ``ID TEXT`` lines, which :class:`OneBestLines` places by id at the end
    (the ids of a list need not come in order). It keeps no count: the same text in whichever
    process formats the chunk."""

    def __init__(
        self, weights: dict | None, weights_path: str | None, one_best: bool, names: list[str]
    ):
        self.names = names
        """The features added to each line, in order."""
        self.weights = weights
        self.weights_path = weights_path
        self.one_best = one_best

    def chunk_text(self, groups: list[list[NBestEntry]], first: bool = False) -> tuple[str, int]:
        """The output text of one chunk's groups (their new features added) and the groups
        whose best hypothesis the weights changed. ``first``: the run's first chunk, whose
        first line is checked for the weighed features (re-ranking without a model)."""
        lines: list[str] = []
        changed = 0
        if first and groups and self.weights is not None and not self.names:
            self._check_weighed(groups[0][0])
        for group in groups:
            if self.weights is None:
                lines.extend(e.line() for e in group)
                continue
            reranked, best, was_best = rerank(group, self.weights, self.weights_path)
            changed += best.hypothesis != was_best.hypothesis
            if self.one_best:
                lines.append(f"{group[0].id} {best.hypothesis}\n")
            else:
                lines.extend(reranked)
        return "".join(lines), changed

    def _check_weighed(self, entry: NBestEntry) -> None:
        """Warn of weights for a feature the list lacks (re-ranking without a model: a
        feature weighed but missing may be the ``-m`` forgotten); one line is enough, every line
        of a list has the same features."""
        listed = {name for name, _ in parse_features(entry.features, entry.path, entry.lineno)}
        missing = [name for name in self.weights if name not in listed and "_" not in name]
        if missing:  # moses.ini weighs features Moses leaves out of lists (UnknownWordPenalty0)
            log.warning(
                "%s: --weights gives %s, which this list lacks (0 in every total): add a model "
                "feature first (nbest -m MODEL --name NAME) if one was meant",
                display_name(entry.path),
                ", ".join(missing),
            )


class ListTally:
    """The run's count of the list, chunk after chunk in input order: its sentences and
    hypotheses, the best hypotheses the weights changed, the ids seen (an id that comes back
    after another is refused at its line; the ids skipped are missing), and at the end
    :meth:`finish`'s check against the source."""

    def __init__(self, n_sources: int, one_best: bool):
        self.n_sources = n_sources
        self.one_best = one_best
        self.sentences = self.hypotheses = self.changed = 0
        self.last_id = -1
        self.final_id = -1
        self.seen: set[int] = set()
        self.missing: list[int] = []
        """Ids without a hypothesis before the last id seen (:meth:`finish` warns)."""

    def add(self, groups: list[GroupSpan], path: str, changed: int = 0) -> None:
        """A chunk's groups, written (``changed``: best hypotheses the weights changed)."""
        self.skip(groups, path)
        self.sentences += len(groups)
        self.hypotheses += sum(group.size for group in groups)
        self.changed += changed

    def skip(self, groups: list[GroupSpan], path: str) -> None:
        """Groups another shard writes (only their ids count)."""
        for group in groups:
            if group.id in self.seen and group.id != self.final_id:
                raise InputError(
                    f"the hypotheses of sentence {group.id} are not contiguous "
                    "(the id comes back after another id)",
                    path,
                    group.lineno,
                )
            self.seen.add(group.id)
            self.missing.extend(gap_ids(self.last_id, group.id))
            self.last_id = max(self.last_id, group.id)
            self.final_id = group.id

    def count_done(self, groups: list[GroupSpan], path: str) -> int:
        """Groups an earlier run wrote (``--resume``): counted as written; their lines in the
        output."""
        self.add(groups, path)
        return len(groups) if self.one_best else sum(group.size for group in groups)

    def finish(self, nbest: str) -> None:
        """Refuse a list that ends before the source; warn of ids without a hypothesis."""
        if self.last_id + 1 != self.n_sources:
            ends = "is empty" if self.last_id < 0 else f"ends with sentence id {self.final_id}"
            if (
                0 <= self.final_id < self.last_id
            ):  # out of order: the highest id is the one that counts
                ends += f" (its highest is {self.last_id})"
            raise InputError(
                f"the n-best list {ends} but the source has "
                f"{self.n_sources} lines: the list and the source do not match (give exactly "
                "the source lines that were decoded)",
                display_name(nbest),
            )
        if self.missing:  # an empty line keeps the 1-best aligned with the source
            log.warning(
                "%s%s",
                missing_ids_message(nbest, self.missing, self.n_sources),
                " --one-best writes an empty line for each" if self.one_best else "",
            )


@dataclass
class OneBestLines:
    """The ``--one-best`` output from the writer's ``ID TEXT`` lines: one line per source
    sentence, its best hypothesis (an empty line for a sentence without any)."""

    n_sources: int

    def __call__(self, lines: Iterable[str]) -> Iterator[str]:
        best = [""] * self.n_sources
        for line in lines:
            sentence_id, _, text = line[:-1].partition(" ")
            best[int(sentence_id)] = text
        return (text + "\n" for text in best)


def rerank(
    group: list[NBestEntry], weights: dict, weights_path: str | None
) -> tuple[list[str], NBestEntry, NBestEntry]:
    """The lines of one id, new features added, ordered by their new totals (written in the
    total field), the new best entry and the old one (best original total)."""
    totals = weighted_totals(group, weights, weights_path)
    old_best = best_index([float(entry.total) for entry in group])
    order = sorted(range(len(group)), key=lambda i: (-totals[i], i))
    lines = [with_total(group[i], totals[i]).line() for i in order]
    return lines, group[order[0]], group[old_best]
