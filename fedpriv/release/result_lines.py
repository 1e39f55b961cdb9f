"""The lines a finished run prints (and its model card quotes): the model's held-out numbers, every
epsilon the run claims with the mode of its randomness, and the audit's headline when it ran one.

Apart from the console (:mod:`fedpriv.release.console`, which every command's output goes through)
so that the console imports nothing of the audit: the end-of-run lines are the run's, one floor up."""

from __future__ import annotations

import math

from fedpriv.release.console import mode_text


def monte_carlo_bound(confidence: float) -> str:
    """How a Monte-Carlo claim's probability is stated (the end-of-run line and the plan's)."""
    return f"with probability >= {confidence:g} (Monte-Carlo bound)"


def format_result(summary: dict) -> str:
    """The lines the CLI prints at the end of a run; every epsilon line names the mode."""
    from fedpriv.audit.report import headline as audit_headline  # lazy: scipy (the audit), off the CLIs

    eps = summary["privacy"]["epsilon"]
    reason = summary["privacy"].get("non_private_reason")
    eps_text = (f"inf (non-private{': ' + reason if reason else ''})"
                if eps is None or (isinstance(eps, float) and math.isinf(eps)) else f"{eps:.4g}")
    claim = summary["privacy"].get("monte_carlo_claim") or {}
    if "confidence" in claim and not eps_text.startswith("inf"):  # a Monte-Carlo bound holds with a stated probability
        eps_text += " " + monte_carlo_bound(claim["confidence"])
    mode = mode_text(summary["privacy"])
    ceiling = summary.get("ceiling_accuracy")
    ceiling_text = f" (Bayes ceiling {ceiling:.4f})" if ceiling else ""
    final = summary["final"]
    accuracy = (f"final next-word accuracy {final['word_accuracy']:.4f}{ceiling_text}, "
                f"next-token accuracy {final['accuracy']:.4f}" if "word_accuracy" in final
                else f"final accuracy {final['accuracy']:.4f}{ceiling_text}")
    return (f"{accuracy}, loss {final['loss']:.4f}\n"
            f"{summary.get('privacy_unit', 'user')}-level epsilon {eps_text} at delta {summary['privacy']['delta']:g} "
            f"({summary['privacy']['accountant']}, {summary['privacy']['neighboring_relation']}), "
            f"noise multiplier {summary['privacy']['noise_multiplier']:.4g}, {_rounds_text(summary['rounds'])} "
            f"[{mode}]{_example_line(summary, mode)}"
            + (f"\n{audit_headline(summary['audit'])}" if "audit" in summary else ""))


def _rounds_text(rounds: int) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{rounds} round{'' if rounds == 1 else 's'}"


def _example_line(summary: dict, mode: str) -> str:
    ex = summary.get("example_privacy")
    if not ex:
        return ""
    eps = "inf" if ex["epsilon"] is None else f"{ex['epsilon']:.4g}"
    return (f"\nexample-level epsilon on clients {eps} at delta {ex['delta']:g} "
            f"({ex['accountant']}, add_or_remove_one example), noise multiplier {ex['noise_multiplier']:.4g}, "
            f"every client assumed in every round"
            f"{_again_text(ex.get('rounds_asked_again_after_an_interruption', 0))} [{mode}]")


def _again_text(again: int) -> str:
    return f", {again} round(s) charged twice (asked again after an interruption)" if again else ""
