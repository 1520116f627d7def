"""The demo's "existing training set": a small SpecForge-style conversations file, 77% code.

The seed job began from a drafter training set whose mix was 77% code; the demo rebuilds that
situation in miniature so that ``stats`` can find the skew and ``merge`` can correct it. Rows are
generated from templates with a seeded RNG (no data files ship with the package) and written as
JSONL lines ``{"id", "conversations": [{"role", "content"}, ...]}``, the format SpecForge reads.
Calling ``write_existing_set`` twice with the same arguments writes the same bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

_LANGS = ["python", "javascript", "go", "rust", "java", "typescript", "c++", "bash"]
_CODE_TASKS = [
    "parses ISO-8601 dates from log lines",
    "deduplicates records by a composite key",
    "retries an HTTP request with exponential backoff",
    "walks a directory tree and sums file sizes",
    "streams lines from a gzip file",
    "reads settings from environment variables",
    "implements a trie with prefix search",
    "batches database writes in a transaction",
    "validates JSON against a small schema",
    "renders a table of results as Markdown",
    "finds broken symlinks in a folder",
    "memoizes a recursive function",
]
_CODE_BODY = {
    "python": "def solve(items):\n    seen = set()\n    out = []\n    for x in items:\n"
    "        if x not in seen:\n            seen.add(x)\n            out.append(x)\n"
    "    return out\n",
    "javascript": "function solve(items) {\n  const seen = new Set();\n"
    "  return items.filter((x) => !seen.has(x) && seen.add(x));\n}\n",
    "go": "func solve(items []int) []int {\n\tseen := map[int]bool{}\n\tvar out []int\n"
    "\tfor _, x := range items {\n\t\tif !seen[x] {\n\t\t\tseen[x] = true\n"
    "\t\t\tout = append(out, x)\n\t\t}\n\t}\n\treturn out\n}\n",
    "rust": "fn solve(items: &[i32]) -> Vec<i32> {\n"
    "    let mut seen = std::collections::HashSet::new();\n"
    "    items.iter().copied().filter(|x| seen.insert(*x)).collect()\n}\n",
    "java": "static List<Integer> solve(List<Integer> items) {\n"
    "    return new ArrayList<>(new LinkedHashSet<>(items));\n}\n",
    "typescript": "function solve(items: number[]): number[] {\n  return [...new Set(items)];\n}\n",
    "c++": "std::vector<int> solve(const std::vector<int>& items) {\n"
    "    std::unordered_set<int> seen;\n    std::vector<int> out;\n"
    "    for (int x : items) if (seen.insert(x).second) out.push_back(x);\n    return out;\n}\n",
    "bash": "solve() {\n  sort --unique --stable\n}\n",
}
_MATH = [
    "A train travels {a} km in {b} hours. What is its average speed in km/h?",
    "Solve for x: {a}x + {b} = {c}.",
    "What is the sum of the first {a} positive integers?",
    "A rectangle is {a} cm by {b} cm. What is its area and its perimeter?",
]
_GENERAL = [
    "Give three tips for writing a clear {thing}.",
    "Summarise the main causes of {event} in a short paragraph.",
    "What should I pack for a {days}-day hiking trip in {place}?",
]
_THINGS = ["cover letter", "project update", "bug report", "README", "thank-you note"]
_EVENTS = ["the French Revolution", "the 2008 financial crisis", "the fall of Rome"]
_PLACES = ["the Alps", "Patagonia", "Scotland", "the Rockies", "Norway"]

#: The demo existing set's shares, as in the seed job (77% code).
EXISTING_SHARES = {"code": 0.77, "math": 0.08, "general": 0.15}


def _code_row(rng: random.Random, i: int) -> list[dict[str, str]]:
    lang = rng.choice(_LANGS)
    task = rng.choice(_CODE_TASKS)
    user = f"Write a {lang} function that {task}. Call it solve and keep it short (variant {i})."
    fence = lang.replace("c++", "cpp")
    answer = (
        f"Here is a {lang} implementation:\n\n```{fence}\n{_CODE_BODY[lang]}```\n\n"
        "It keeps the first occurrence of each item and preserves the input order."
    )
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def _math_row(rng: random.Random, i: int) -> list[dict[str, str]]:
    a, b = rng.randint(2, 90), rng.randint(2, 9)
    c = a * rng.randint(2, 9) + b
    user = rng.choice(_MATH).format(a=a, b=b, c=c) + f" (problem {i})"
    answer = (
        f"We compute step by step. With a = {a} and b = {b}, the equation gives the result "
        f"{a * b} after multiplying, so the answer is {a * b}."
    )
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def _general_row(rng: random.Random, i: int) -> list[dict[str, str]]:
    user = rng.choice(_GENERAL).format(
        thing=rng.choice(_THINGS),
        event=rng.choice(_EVENTS),
        days=rng.randint(2, 9),
        place=rng.choice(_PLACES),
    )
    answer = f"Here are a few thoughts (note {i}): be concrete, keep it short, and end with a plan."
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def write_existing_set(path: Path, rows: int = 400, seed: int = 0) -> dict[str, int]:
    """Write ``rows`` conversations (77% code, 8% math, 15% general) to ``path`` as JSONL.

    Returns the number of rows written per intended domain.
    """
    rng = random.Random(seed)
    counts = {d: round(rows * s) for d, s in EXISTING_SHARES.items()}
    counts["code"] += rows - sum(counts.values())
    makers = {"code": _code_row, "math": _math_row, "general": _general_row}
    order = [d for d, n in counts.items() for _ in range(n)]
    rng.shuffle(order)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for i, domain in enumerate(order):
            row = {"id": f"existing-{i:06d}", "conversations": makers[domain](rng, i)}
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    return counts
