"""GSM8K's answer format: worked solutions with `<<a op b=c>>` calculator annotations ending in `#### N`.

What a runtime needs to judge a generated solution (spot bench, spot demo) without the training code: the final
answer, whether it is right, and whether the solution's own arithmetic holds.
"""
from __future__ import annotations

import re


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0 or a % b:
            raise ValueError(f"{a}/{b} is not an exact integer division")
        return a // b
    raise ValueError(f"unknown operation {op!r}")



_FINAL = re.compile(r"####\s*(-?[\d,]+)")
_CALC = re.compile(r"<<([^<>=]+)=([^<>]*)>>")
_BINARY = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*$")


def final_answer(text: str) -> int | None:
    """The number after the first '#### ' of a solution (GSM8K's answer line), or None if there is none."""
    m = _FINAL.search(text)
    if m is None:
        return None
    digits = m.group(1).replace(",", "")
    try:
        return int(digits)
    except ValueError:
        return None


def is_correct(text: str, answer: int) -> bool:
    return final_answer(text) == answer


def check_calculations(text: str) -> list[str]:
    """Every '<<a op b=c>>' annotation of a solution whose c is not a op b (empty: all correct)."""
    wrong = []
    for expr, claimed in _CALC.findall(text):
        m = _BINARY.match(expr)
        try:
            ok = m is not None and apply_op(int(m.group(1)), m.group(2), int(m.group(3))) == int(claimed)
        except ValueError:
            ok = False
        if not ok:
            wrong.append(f"<<{expr}={claimed}>>")
    return wrong


def recompute_answer(text: str) -> int | None:
    """The final answer recomputed from the solution's own annotations: the value of the last one."""
    calcs = _CALC.findall(text)
    if not calcs:
        return None
    m = _BINARY.match(calcs[-1][0])
    if m is None:
        return None
    return apply_op(int(m.group(1)), m.group(2), int(m.group(3)))
