"""``phrasescore merge-shards``: check the parts of ``rescore --shard K/N`` or ``nbest --shard
K/N`` (complete, one job, every shard once; :mod:`phrasescore.runners.merge`) and join them into
one file, byte-identical to an unsharded run; for a phrase table, also the new moses.ini.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.kinds import is_stream_target
from phrasescore.files.outputs import check_output_paths
from phrasescore.jobs.rescore.ini_update import IniUpdate, default_ini_out, ini_report_lines
from phrasescore.runners.merge import check_not_a_part, check_parts, merge_shards, recorded_inputs
from phrasescore.runners.shards import NBEST, PHRASE_TABLE, manifest_path


@dataclass
class MergeJobResult:
    merge: object
    ini_out: str | None = None
    ini_update: object | None = None

    def lines(self) -> list[str]:
        """The summary ``merge-shards`` prints on standard error, and the moses.ini written."""
        merged = self.merge
        if merged.groups is None:
            what = f"{merged.lines} lines"
        elif merged.kind == NBEST:
            what = f"{merged.lines} hypotheses of {merged.groups} sentences"
        else:
            what = f"{merged.lines} lines, {merged.groups} distinct sources"
        output = "<stdout>" if merged.output == "-" else merged.output
        summary = f"phrasescore: {merged.parts} parts, {merged.chunks} chunks, {what} -> {output}"
        return [summary, *ini_report_lines(self.ini_out, self.ini_update)]


def run_merge(
    parts: list[str],
    output: str,
    moses_ini: str | None = None,
    ini_out: str | None = None,
    ini_table: str | None = None,
    weight: float = 0.2,
) -> MergeJobResult:
    """``phrasescore merge-shards``: check and merge the parts (of ``rescore --shard`` or
    ``nbest --shard``), then write the new moses.ini (checked before anything is written; its
    table is the input the shards read)."""
    ini = None
    if moses_ini:
        if output == "-" or is_stream_target(output):
            raise InputError(
                "--moses-ini needs an output file for the ini to name, not standard output, a "
                "named pipe or a device"
            )
        ini_out = ini_out or default_ini_out(moses_ini)
    refuse_outputs_onto_inputs(
        {
            "part": parts,
            "part's manifest": [manifest_path(part) for part in parts],
            "input the parts were scored from": recorded_inputs(parts),
            "--moses-ini": moses_ini,
        },
        {"-o": output, "--ini-out": ini_out if moses_ini else None},
    )
    check_output_paths({"output table": output, "moses.ini": ini_out if moses_ini else None})
    check_not_a_part(output, parts)
    check_not_a_part(ini_out if moses_ini else None, parts, "moses.ini")
    if moses_ini:
        manifest = check_parts(parts)[0][1]
        if manifest["kind"] != PHRASE_TABLE:
            raise InputError("--moses-ini is for the parts of a phrase table, not an n-best list")
        n_new = len(manifest["job"]["columns"])
        table = ini_table or manifest["input_path"]
        ini = IniUpdate(moses_ini, table, os.path.abspath(output), n_new, weight, ini_out)
    merged = merge_shards(parts, output)
    if ini is None:
        return MergeJobResult(merged)
    ini.before_publish(merged)
    return MergeJobResult(merged, ini_out, ini.publish())
