"""Bounds on the arithmetic that model-written code may ask for, checked before the operation runs.

One CPython operation on big integers (a product, a power, ``round(7, -999999999)``) is a single C call: it
holds the GIL until it returns, and no thread, timer or operation budget can stop it. These checks are the
only guard, so they run on the operands, before the operation. The PTC interpreter (``agent.ptc``) and the
calculator tool (``agent.tools``) share them.

Each ``*_problem`` function returns None when the operation is within bounds, or a one-line reason the caller
raises as its own model-visible error.
"""

from __future__ import annotations

import math
from typing import Any

#: the most decimal digits an integer may have (a 1000-digit product or power costs microseconds)
MAX_INT_DIGITS = 1000
#: MAX_INT_DIGITS in bits (log2(10) < 3.33)
_MAX_INT_BITS = MAX_INT_DIGITS * 3.33


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer_problem(value: Any) -> str | None:
    """Why ``value`` is too large an integer to keep (None: it is not, or it is no integer)."""
    if _is_int(value) and value.bit_length() > _MAX_INT_BITS:
        return f"integer with more than {MAX_INT_DIGITS} digits refused"
    return None


def product_problem(left: Any, right: Any) -> str | None:
    """Why ``left * right`` of two integers would be too large (None: it would not, or they are not both integers)."""
    if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > _MAX_INT_BITS + 64:
        return f"integer with more than {MAX_INT_DIGITS} digits refused"
    return None


def power_problem(base: Any, exponent: Any) -> str | None:
    """Why ``base ** exponent`` would have too many digits (None: it would not, or it is no numeric power)."""
    if _is_number(base) and _is_int(exponent) and abs(exponent) > 1 and abs(base) > 1:
        if exponent * math.log10(abs(base)) > MAX_INT_DIGITS:
            return f"'**' result would have more than {MAX_INT_DIGITS} digits; refused"
    return None


def round_problem(ndigits: Any) -> str | None:
    """Why ``round(x, ndigits)`` may not run: rounding an int to -n digits computes 10**n."""
    if isinstance(ndigits, int) and abs(ndigits) > MAX_INT_DIGITS:
        return f"round(): ndigits beyond +-{MAX_INT_DIGITS} refused"
    return None
