"""Why a call compiles again: for every compiled entry of its code that belongs to the
same optimize() settings (most recent first), the guard that failed, in plain words
(``x.size(0): 8 → 16``).  Read by the recompile log, the cache-limit warning and the
"fail_on_recompile" stance."""
from __future__ import annotations

from . import _C


def entry_reasons(code, func, args, callback) -> list[str]:
    """One line per entry of `code` made by `callback`, most recent first.  Entries of
    other optimize() settings (another backend, explain()'s own) are not this call's
    to match, and are left out."""
    reasons = []
    try:
        entries = _C.entries(code)
    except Exception:
        return reasons
    for entry in entries:
        check = entry.check
        if getattr(check, "callback", None) is not callback:
            continue
        guard_set = getattr(check, "guard_set", None)
        if guard_set is None:
            continue
        try:
            words = guard_set.failure_in_words(args, func)
        except Exception as e:
            words = f"(its guards could not be read again: {type(e).__name__}: {e})"
        # (All guards hold: an entry another thread added meanwhile, which the hook
        # did not see yet.)
        reasons.append(words or "every guard holds now")
    return reasons


def describe(name: str, code, reasons) -> str:
    """`name (file:line)` and the reasons: on one line for one entry, else numbered."""
    where = f"{name} ({code.co_filename}:{code.co_firstlineno})"
    if len(reasons) == 1:
        return f"{where}: {reasons[0]}"
    lines = [f"{where}: none of its {len(reasons)} entries fits (most recent first):"]
    lines += [f"  {i}. {r}" for i, r in enumerate(reasons, 1)]
    return "\n".join(lines)
