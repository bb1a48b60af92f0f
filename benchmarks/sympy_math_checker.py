#!/usr/bin/python3
"""bench_reward's baseline: a sympy-based math answer checker.

Does what a typical Python RL reward function does with sympy (the approach of
Math-Verify, minus its antlr LaTeX grammar, which Debian's python3-antlr4 4.9
cannot run for sympy 1.11): turn both LaTeX answers into sympy expressions with
a light LaTeX-to-Python rewrite, then decide equivalence by rounding numbers to
the case's precision and, failing that, by simplify(a - b) == 0. Sets compare
as sets, tuples element-wise, "x = 5" by its right-hand side.

Usage: sympy_math_checker.py --cases cases.jsonl [--seconds S] [--json FILE]
Prints one JSON object: comparisons done, seconds, verifications/s, agreement
with the cases' expected labels. Only Debian's /usr/bin/python3 has sympy.
"""
import argparse
import json
import re
import signal
import sys
import time

import sympy
from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application,
                                        parse_expr, standard_transformations)

TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor)


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def strip_math(text):
    text = text.strip()
    boxed = text.rfind("\\boxed{")
    if boxed >= 0:
        depth, i = 0, boxed + len("\\boxed")
        start = i + 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
            i += 1
    for left, right in (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")):
        if text.startswith(left) and text.endswith(right) and len(text) > len(left) + len(right):
            return text[len(left):-len(right)]
    return text


def latex_to_python(s):
    s = strip_math(s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\mathrm\{([^{}]*)\}", r"\1", s)
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
    s = re.sub(r"\\[dt]?frac(\d)(\d)", r"((\1)/(\2))", s)
    s = re.sub(r"\\sqrt\[([^{}\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", s)
    s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    s = re.sub(r"\\sqrt(\d)", r"sqrt(\1)", s)
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    s = s.replace("\\pi", "pi").replace("\\infty", "oo").replace("\\ln", "log")
    s = s.replace("\\log", "log").replace("\\sin", "sin").replace("\\cos", "cos")
    s = s.replace("\\tan", "tan").replace("\\exp", "exp")
    s = s.replace("{", "(").replace("}", ")").replace("\\", "")
    s = s.replace("\u2212", "-")
    s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", s)
    return s.strip().rstrip(".")


def to_sympy(text):
    s = latex_to_python(text)
    if "=" in s and not any(op in s for op in ("<=", ">=", "==")):
        s = s.split("=")[-1]
    if s.startswith("(") and s.endswith(")") and "," in s:
        parts = split_top(s[1:-1])
        if len(parts) > 1:
            return ("tuple", [parse_expr(p, transformations=TRANSFORMS) for p in parts])
    if "," in s:
        parts = split_top(s)
        if len(parts) > 1:
            return ("set", [parse_expr(p, transformations=TRANSFORMS) for p in parts])
    return ("expr", parse_expr(s, transformations=TRANSFORMS))


def split_top(s):
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expr_equal(a, b, precision):
    try:
        if a == b:
            return True
        na, nb = a.evalf(), b.evalf()
        if na.is_number and nb.is_number:
            return round(complex(na).real, precision) == round(complex(nb).real, precision) and \
                round(complex(na).imag, precision) == round(complex(nb).imag, precision)
        return sympy.simplify(a - b) == 0
    except Exception:
        return False


def equal(gold, pred, precision):
    kg, g = to_sympy(gold)
    kp, p = to_sympy(pred)
    if kg == "expr" and kp == "expr":
        return expr_equal(g, p, precision)
    if kg == "set" or kp == "set":
        gl = g if isinstance(g, list) else [g]
        pl = p if isinstance(p, list) else [p]
        return len(gl) == len(pl) and all(any(expr_equal(x, y, precision) for y in pl) for x in gl)
    if kg == "tuple" and kp == "tuple":
        return len(g) == len(p) and all(expr_equal(x, y, precision) for x, y in zip(g, p))
    return False


def check(case, per_case_timeout):
    signal.setitimer(signal.ITIMER_REAL, per_case_timeout)
    try:
        return equal(case["gold"], case["prediction"], case.get("precision") or 6)
    except Exception:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--per-case-timeout", type=float, default=5.0)
    parser.add_argument("--json", default="-")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    cases = [json.loads(line) for line in open(args.cases, encoding="utf-8") if line.strip()]
    agree, timeouts = 0, 0
    start = time.perf_counter()
    first_pass = []
    for case in cases:
        try:
            got = check(case, args.per_case_timeout)
        except Timeout:
            got, timeouts = False, timeouts + 1
        first_pass.append(got)
        agree += got == case["expected"]
    done = len(cases)
    # Keep going over the cases until the time budget is spent, as the C++
    # side does, so both rates average over the same mix.
    while time.perf_counter() - start < args.seconds:
        for case in cases:
            try:
                check(case, args.per_case_timeout)
            except Timeout:
                pass
            done += 1
            if time.perf_counter() - start >= args.seconds:
                break
    seconds = time.perf_counter() - start
    result = {
        "checker": "sympy " + sympy.__version__,
        "cases": len(cases),
        "comparisons": done,
        "seconds": seconds,
        "verifications_per_s": done / seconds,
        "agreement": agree / len(cases),
        "timeouts": timeouts,
    }
    text = json.dumps(result)
    if args.json == "-":
        print(text)
    else:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
