"""``specparity contract``: write, inspect and validate contracts (from SpecForge or speculators artifacts, or
from configs alone), and the click group class every ``specparity`` command runs under, which maps
specparity's errors to their exit codes and one-line messages (:mod:`specparity.errors`). ``cli.py`` adds this
group to the ``specparity`` command.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from specparity.contract.model import SpecConfig, TrainingOutcome
from specparity.errors import EXIT_ENVIRONMENT, InputError, SpecparityError


class _Group(click.Group):
    """Maps our exceptions to exit codes and one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        from specparity.serving.child import reaper

        try:
            with reaper.signals_unwind():  # SIGTERM/SIGHUP unwind like Ctrl-C: every finally stops what it started
                return super().invoke(ctx)
        except (KeyboardInterrupt, reaper.Interrupted) as e:
            # never exit 1 (a mismatch) for a run that was cut short: 130 (SIGINT) or 143 (SIGTERM), as a shell says
            code = e.exit_code if isinstance(e, reaper.Interrupted) else 130
            name = e.signal_name if isinstance(e, reaper.Interrupted) else "SIGINT"
            reaper.stop_all()
            click.echo(f"specparity: interrupted by {name}: every process it started is stopped; no verdict",
                       err=True)
            ctx.exit(code)
        except SpecparityError as e:
            if os.environ.get("SPECPARITY_DEBUG"):
                raise
            click.echo(f"specparity: error: {e}", err=True)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # an internal bug must still not end in a raw traceback
            if os.environ.get("SPECPARITY_DEBUG"):
                raise
            click.echo(
                f"specparity: internal error: {type(e).__name__}: {e} (set SPECPARITY_DEBUG=1 for the traceback)",
                err=True,
            )
            ctx.exit(EXIT_ENVIRONMENT)



@click.group(cls=_Group)
def contract() -> None:
    """Write, inspect and validate contracts."""


def _parse_created_at(value: str | None) -> datetime | None:
    if value is None:
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        if epoch is None:
            return None
        from datetime import timezone

        return datetime.fromtimestamp(int(epoch), tz=timezone.utc)
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"not an ISO 8601 timestamp: {value!r}", field="--created-at") from None


def _outcome(text: str | None) -> TrainingOutcome | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated numbers, got {text!r}", field="--train-accuracy") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise InputError(f"accuracies must lie in 0..1, got {text!r}", field="--train-accuracy")
    return TrainingOutcome(accuracy_per_position=values)


def _with_measured_acceptance(c: Any, path: Path, *, draft: Path, target: Path) -> Any:
    from specparity.contract import read_contract_probes, save_contract
    from specparity.replay.outcome import recorded_acceptance

    steps = c.serving.num_steps
    if steps is None:
        raise InputError("--measure-acceptance needs --serve-steps (the chain length to measure)", field="--serve-steps")
    pack = read_contract_probes(c, path)
    result = recorded_acceptance(pack, draft=draft, target=target, num_steps=steps)
    outcome = (c.training_outcome or TrainingOutcome()).model_copy(update={
        "acceptance_per_position": [round(a, 6) for a in result.defined],
        "expected_acceptance_length": round(result.acceptance_length, 6)})
    c = c.model_copy(update={"training_outcome": outcome})
    save_contract(c, path)
    return c


@contract.command("from-specforge")
@click.option("--hidden-states", "hidden_states", required=True, type=click.Path(path_type=Path),
              help="SpecForge offline output dir (rows_*/data_N.ckpt[.gz]).")
@click.option("--draft", required=True, type=click.Path(path_type=Path), help="Draft export dir or its config.json.")
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target model dir (config.json, tokenizer).")
@click.option("--vocab-mapping", type=click.Path(path_type=Path), default=None, help="vocab_mapping.pt (d2t/t2d).")
@click.option("--probes", default=4, show_default=True, type=click.IntRange(min=1), help="Samples in the probe pack.")
@click.option("--max-probe-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="Tokens kept per probe sample.")
@click.option("--name", default=None, help="Contract name (default: from the output file name).")
@click.option("--created-at", default=None, help="ISO timestamp for provenance (default: now, or SOURCE_DATE_EPOCH).")
@click.option("--run-id", default=None, help="Training run id for provenance.")
@click.option("--serve-steps", type=click.IntRange(min=1), default=None, help="speculative_num_steps to serve with.")
@click.option("--serve-topk", type=click.IntRange(min=1), default=None, help="speculative_eagle_topk to serve with.")
@click.option("--serve-draft-tokens", type=click.IntRange(min=1), default=None,
              help="speculative_num_draft_tokens to serve with.")
@click.option("--train-accuracy", default=None, metavar="A0[,A1,...]",
              help="Training-time draft accuracy per position (e.g. SpecForge acc_0,acc_1), 0..1.")
@click.option("--measure-acceptance", is_flag=True, default=False,
              help="Replay the drafter on the probes' recorded fc inputs (no SGLang) and record its acceptance "
                   "per position as the contract's expectation (needs --serve-steps).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Contract JSON to write.")
def from_specforge(hidden_states: Path, draft: Path, target: Path, vocab_mapping: Path | None, probes: int,
                   max_probe_tokens: int, name: str | None, created_at: str | None, run_id: str | None,
                   serve_steps: int | None, serve_topk: int | None, serve_draft_tokens: int | None,
                   train_accuracy: str | None, measure_acceptance: bool, output: Path) -> None:
    """Write a contract (and its probe pack beside it) from SpecForge's offline hidden states."""
    from specparity.training.specforge import contract_from_specforge

    c, path = contract_from_specforge(
        hidden_states, draft, target, out=output, vocab_mapping=vocab_mapping, name=name, probes=probes,
        max_probe_tokens=max_probe_tokens, created_at=_parse_created_at(created_at), run_id=run_id,
        serving=SpecConfig(num_steps=serve_steps, eagle_topk=serve_topk, num_draft_tokens=serve_draft_tokens),
        training_outcome=_outcome(train_accuracy),
    )
    if measure_acceptance:
        c = _with_measured_acceptance(c, path, draft=draft, target=target)
    probes_ref = c.probes
    assert probes_ref is not None  # the importer always writes a probe pack
    click.echo(f"wrote {path} ({', '.join(c.fc_input.sources)}; {probes_ref.num_samples} probes, "
               f"{probes_ref.num_tokens} tokens in {probes_ref.file})")
    if c.training_outcome and c.training_outcome.acceptance_per_position:
        acc = ", ".join(f"{a:.3f}" for a in c.training_outcome.acceptance_per_position)
        click.echo(f"measured acceptance per position on the recorded probes: {acc}")


@contract.command("from-speculators")
@click.option("--hidden-states", "hidden_states", required=True, type=click.Path(path_type=Path),
              help="speculators data dir (hs_N.safetensors).")
@click.option("--draft", required=True, type=click.Path(path_type=Path), help="speculators eagle3 dir or config.json.")
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target (verifier) model dir.")
@click.option("--probes", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--max-probe-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--name", default=None)
@click.option("--created-at", default=None)
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
def from_speculators(hidden_states: Path, draft: Path, target: Path, probes: int, max_probe_tokens: int,
                     name: str | None, created_at: str | None, output: Path) -> None:
    """Write a contract from a speculators eagle3 config and its hs_N.safetensors data."""
    from specparity.training.speculators import contract_from_speculators

    c, path = contract_from_speculators(hidden_states, draft, target, out=output, name=name, probes=probes,
                                        max_probe_tokens=max_probe_tokens, created_at=_parse_created_at(created_at))
    click.echo(f"wrote {path} ({', '.join(c.fc_input.sources)}; {c.probes.num_samples if c.probes else 0} probes)")


@contract.command("from-config")
@click.option("--draft", required=True, type=click.Path(path_type=Path), help="Draft dir or its config JSON.")
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target dir or its config JSON.")
@click.option("--trainer", required=True, type=click.Choice(["specforge", "speculators", "eagle"]),
              help="The tool that trained the drafter (decides how its ids, or its default, read).")
@click.option("--trainer-sglang-version", default=None,
              help="SGLang version the trainer captured with (SpecForge; the DeepSeek/Kimi rule changed in 0.5.13).")
@click.option("--name", default=None, help="Contract name (default: from the output file name).")
@click.option("--created-at", default=None, help="ISO timestamp for provenance (default: now, or SOURCE_DATE_EPOCH).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Contract JSON to write.")
def from_config(draft: Path, target: Path, trainer: str, trainer_sglang_version: str | None, name: str | None,
                created_at: str | None, output: Path) -> None:
    """Write a contract without probes, from configs alone; its layout is recorded as assumed.

    `gate --level static` checks it; capture and outcome need recordings and refuse it.
    """
    from specparity.training.fromconfig import contract_from_config

    c, path = contract_from_config(draft, target, trainer=trainer,  # type: ignore[arg-type]
                                   trainer_sglang_version=trainer_sglang_version, out=output, name=name,
                                   created_at=_parse_created_at(created_at))
    assert c.layout_assumed is not None
    click.echo(f"wrote {path} ({', '.join(c.fc_input.sources)}; no probes, layout assumed: {c.layout_assumed.reason})")


@contract.command("show")
@click.argument("file", type=click.Path(path_type=Path))
def show(file: Path) -> None:
    """Print a contract in words."""
    from specparity.contract import load_contract

    c = load_contract(file)
    t, d, lay = c.target, c.drafter, c.fc_input
    ids = "none (tool default)" if c.layer_ids.ids is None else str(c.layer_ids.ids)
    lines = [
        f"contract {c.name} (schema v{c.schema_version}, hash {(c.content_hash or '')[:12]})",
        f"  target   {t.architecture}: {t.num_hidden_layers} layers, hidden {t.hidden_size}, vocab {t.vocab_size}, {t.dtype}",
        f"  fc input {', '.join(lay.sources)}  ({len(lay.sources)} x {lay.chunk_widths[0]} = {lay.total_width}, {lay.dtype})",
        f"  ids      {ids} as {c.layer_ids.convention.value} ({c.layer_ids.tool}, from {c.layer_ids.origin})",
        f"  drafter  {d.architecture}: fc {d.fc_in_features} -> {d.fc_out_features}, bias {d.fc_bias}, "
        f"norm_before_fc {d.norm_before_fc}, fc_norm {d.fc_norm}, norm_output {d.norm_output}, "
        f"draft vocab {d.draft_vocab_size}",
        f"  serving  steps {c.serving.num_steps}, topk {c.serving.eagle_topk}, draft tokens {c.serving.num_draft_tokens}",
        f"  probes   {c.probes.num_samples} samples, {c.probes.num_tokens} tokens in {c.probes.file}" if c.probes
        else f"  probes   none: layout assumed ({c.layout_assumed.reason if c.layout_assumed else '?'})",
        f"  made by  {c.provenance.tool} at {c.provenance.created_at.isoformat()}",
    ]
    if c.training_outcome and c.training_outcome.acceptance_per_position:
        acc = ", ".join(f"{a:.2f}" for a in c.training_outcome.acceptance_per_position)
        lines.append(f"  outcome  acceptance per position {acc}")
    click.echo("\n".join(lines))


@contract.command("validate")
@click.argument("file", type=click.Path(path_type=Path))
def validate(file: Path) -> None:
    """Exit 0 when FILE is a valid contract whose probe pack is present and unaltered; 2 otherwise."""
    from specparity.contract import load_contract, read_contract_probes

    c = load_contract(file)
    if c.probes is None:
        click.echo(f"{file}: valid contract {c.name} ({', '.join(c.fc_input.sources)}; no probe pack: the layout is "
                   "assumed, so only `gate --level static` can check it)")
        return
    pack = read_contract_probes(c, file)
    if pack.sources != c.fc_input.sources:
        raise InputError(f"probe pack sources {pack.sources} differ from fc_input.sources", path=file,
                         field="fc_input.sources")
    click.echo(f"{file}: valid contract {c.name} ({', '.join(c.fc_input.sources)}; {len(pack.samples)} probes)")


@contract.command("rehash")
@click.argument("file", type=click.Path(path_type=Path))
def rehash(file: Path) -> None:
    """Recompute the content hash of a contract you edited on purpose (it is validated first)."""
    import json

    from specparity.contract import parse_contract, save_contract
    from specparity.contract.io import load_json

    data = load_json(file)
    if isinstance(data, dict):
        data.pop("content_hash", None)
    c = parse_contract(data, path=file)
    save_contract(c, file)
    click.echo(f"{file}: content_hash {json.loads(file.read_text())['content_hash'][:12]}…")


@contract.command("schema")
def schema() -> None:
    """Print the contract's JSON Schema."""
    from specparity.contract import json_schema_text

    click.echo(json_schema_text(), nl=False)
