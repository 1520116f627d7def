"""Small bundled sample sources in the six source schemas, generated in code (no data files).

``write_sample_sources(dir)`` writes a few dozen rows per schema — Infinity-Instruct 0625
(jsonl), WebInstructSub (parquet), CodeFeedback (jsonl), MetaMathQA (one json array), Hermes
function calling v1 (jsonl, Python-literal ``<tools>``) and AgentInstruct (jsonl) — with
deliberately messy rows among them: empty content, an unknown role, wrong types, an unparsable
tool spec, a bad JSON line, no user turn, exact duplicates and near-duplicates. The demo and the
tests use it; ``sample_config`` is the matching prepare config (the same as
``examples/quickstart.yaml``). The output is the same bytes on every call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from draftdata.prepare.config import DedupConfig, ExistingConfig, PrepareConfig, SourceConfig

Row = dict[str, Any]

_TOPICS = [
    "the sea at dawn",
    "an old lighthouse",
    "a city at night",
    "the first snow of winter",
    "a forgotten library",
    "a train crossing the desert",
    "a grandmother's kitchen",
    "the last day of summer",
    "a lost umbrella",
    "a market in Marrakech",
]
_GENERAL = [
    "Write a short poem about {t}.",
    "Describe {t} in three vivid sentences.",
    "Tell a two-paragraph story set around {t}.",
]
_CODE_TASKS = [
    ("reverses a linked list", "python"),
    ("checks whether a string is a palindrome", "javascript"),
    ("merges two sorted arrays", "java"),
    ("parses a CSV line with quoted fields", "python"),
    ("computes the Levenshtein distance of two strings", "c++"),
    ("finds the longest common prefix of a list of strings", "go"),
    ("validates an email address with a regex", "python"),
    ("implements an LRU cache", "rust"),
    ("flattens a nested list", "python"),
    ("counts word frequencies in a text file", "bash"),
    ("serialises a binary tree to a string", "java"),
    ("rate-limits calls to a function", "typescript"),
]
_NAMES = ["Ava", "Ben", "Carla", "Dev", "Emma", "Farid", "Gia", "Hugo", "Ines", "Jon"]
_ITEMS = ["apples", "notebooks", "pencils", "tickets", "candles", "stamps"]


def _infinity() -> list[Row | str]:
    rows: list[Row | str] = []
    for i, t in enumerate(_TOPICS):
        for j, tmpl in enumerate(_GENERAL):
            q = tmpl.format(t=t)
            rows.append(
                {
                    "id": f"ii-{i * 3 + j:04d}",
                    "conversations": [
                        {"from": "human", "value": q},
                        {"from": "gpt", "value": f"Here is my answer about {t}."},
                    ],
                    "label": {"ability_en": ["creative writing"], "cate_ability_en": ["writing"]},
                    "langdetect": "en",
                    "source": "Subjective",
                }
            )
    rows.append(
        {
            "id": "ii-multi",
            "conversations": [
                {"from": "system", "value": "You are a concise assistant."},
                {"from": "human", "value": "Name three rivers in Europe."},
                {"from": "gpt", "value": "The Danube, the Rhine and the Loire."},
                {"from": "human", "value": "Which of them is the longest?"},
                {"from": "gpt", "value": "The Danube."},
            ],
            "langdetect": "en",
            "source": "Subjective",
        }
    )
    first = rows[0]
    assert isinstance(first, dict)
    messy: list[Row | str] = [
        {"id": "ii-empty", "conversations": [{"from": "human", "value": "  "}]},
        {"id": "ii-role", "conversations": [{"from": "narrator", "value": "Once upon a time"}]},
        {"id": "ii-type", "conversations": [{"from": "human", "value": 12345}]},
        {"id": "ii-nouser", "conversations": [{"from": "gpt", "value": "Hello! How can I help?"}]},
        {"id": "ii-notlist", "conversations": "human: hi"},
        '{"id": "ii-badjson", "conversations": [{"from": "human", "value": "unterminated',
        {**first, "id": "ii-dup"},
        {
            "id": "ii-near",
            "conversations": [
                {"from": "human", "value": "Write a  short poem about the sea at dawn!!"},
                {"from": "gpt", "value": "A near-duplicate of ii-0000."},
            ],
        },
    ]
    return rows + messy


def _webinstruct() -> list[Row]:
    rows: list[Row] = []
    for a in range(2, 8):
        for n in (2, 3, 4, 5):
            rows.append(
                {
                    "question": f"Find the derivative of $f(x) = {a}x^{n} + {a + n}x$ and "
                    f"evaluate it at $x = {n}$.",
                    "answer": f"$f'(x) = {a * n}x^{{{n - 1}}} + {a + n}$.",
                    "source": ["mathstackexchange", "socratic", "stackexchange"][(a + n) % 3],
                }
            )
    rows += [
        {"question": "", "answer": "nothing asked", "source": "socratic"},
        {"question": None, "answer": "no question", "source": "socratic"},
        dict(rows[0]),
    ]
    return rows


def _codefeedback() -> list[Row | str]:
    rows: list[Row | str] = []
    for i, (task, lang) in enumerate(_CODE_TASKS):
        for style in ("Write a {lang} function that {task}.", "In {lang}: {task}, step by step?"):
            rows.append(
                {
                    "query": style.format(lang=lang, task=task),
                    "answer": f"```{lang}\n// solution {i}\n```",
                    "resource": "evol-codealpaca-v1" if i % 2 else "Magicoder-Evol-Instruct",
                    "lang": lang,
                }
            )
    rows += [
        {"query": None, "answer": "x", "resource": "r", "lang": "python"},
        {"query": ["not", "a", "string"], "answer": "x", "resource": "r", "lang": "python"},
        '{"query": "Fix this: def f(:", "answer": }',
        {"query": "Write a python function that reverses a linked list.", "lang": "python"},
    ]
    return rows


def _metamath() -> list[Row]:
    rows: list[Row] = []
    for i, name in enumerate(_NAMES):
        for j, item in enumerate(_ITEMS[:3]):
            n, p = 3 + i, 2 + j
            q = (
                f"{name} buys {n} boxes of {item}. Each box costs ${p}. "
                f"How much does {name} spend in total?"
            )
            rows.append(
                {
                    "type": ["GSM_AnsAug", "GSM_Rephrased", "MATH_AnsAug"][j],
                    "query": q,
                    "original_question": q,
                    "response": f"{n} * {p} = {n * p}. The answer is: {n * p}",
                }
            )
    rows += [
        {"type": "GSM_SV", "query": "", "original_question": "", "response": "The answer is: 0"},
        {"type": "GSM_FOBAR", "query": 42, "original_question": "?", "response": "42"},
        {"type": "GSM_AnsAug", "original_question": "no query field", "response": "1"},
        {**rows[0], "query": rows[0]["query"].upper()},  # an exact duplicate after normalising
    ]
    return rows


_HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user query."
    " Don't make assumptions about what values to plug into functions.\n<tools>\n{tools}\n"
    "</tools>\nFor each function call return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags."
)
_FUNCTIONS = [
    ("get_weather", "Get the current weather for a city", "city", "Paris"),
    ("get_stock_price", "Get the latest price of a stock", "symbol", "ACME"),
    ("convert_currency", "Convert an amount between currencies", "to", "EUR"),
    ("search_recipes", "Search recipes by ingredient", "ingredient", "lentils"),
    ("book_table", "Book a restaurant table", "restaurant", "Chez Nous"),
    ("translate_text", "Translate text into a language", "language", "German"),
]


def _spec(name: str, desc: str, arg: str) -> Row:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"The {arg}"}},
                "required": [arg],
            },
        },
    }


def _hermes() -> list[Row | str]:
    rows: list[Row | str] = []
    for i, (name, desc, arg, val) in enumerate(_FUNCTIONS):
        for k, ask in enumerate(("What is", "Can you tell me", "Please look up", "I need")):
            tools = repr([_spec(name, desc, arg)])  # Python literal: single quotes, True/None
            call = repr({"arguments": {arg: f"{val} {k}"}, "name": name})
            rows.append(
                {
                    "id": f"hfc-{i * 4 + k:03d}",
                    "conversations": [
                        {"from": "system", "value": _HERMES_SYSTEM.format(tools=tools)},
                        {"from": "human", "value": f"{ask} {desc.lower()} for {val} {k}?"},
                        {"from": "gpt", "value": f"<tool_call>\n{call}\n</tool_call>"},
                        {
                            "from": "tool",
                            "value": "<tool_response>\n"
                            + repr({"name": name, "content": {"result": f"ok {i}-{k}"}})
                            + "\n</tool_response>",
                        },
                        {"from": "gpt", "value": f"The result is ok {i}-{k}."},
                    ],
                    "category": "Utility",
                    "subcategory": name,
                    "task": desc,
                }
            )
    bad_tools = (
        "<tools>\n[{'type': 'function', 'function': {'name': 'oops', 'parameters': {\n</tools>"
    )
    rows += [
        {
            "id": "hfc-badspec",
            "conversations": [
                {"from": "system", "value": _HERMES_SYSTEM.replace("{tools}", bad_tools)},
                {"from": "human", "value": "Call the broken tool."},
                {"from": "gpt", "value": "<tool_call>\n{'name': 'oops'}\n</tool_call>"},
            ],
        },
        {
            "id": "hfc-column",
            "conversations": [
                {"from": "system", "value": "You can call functions."},
                {"from": "human", "value": "Translate 'good night' into Italian."},
                {"from": "gpt", "value": "Buona notte."},
            ],
            "tools": json.dumps([_spec("translate_text", "Translate text", "language")]),
        },
        {"id": "hfc-type", "conversations": [{"from": "human", "value": None}]},
    ]
    return rows


def _agent() -> list[Row | str]:
    intro = (
        "You are an assistant that will act like a person, I'will play the role of linux "
        "(ubuntu) operating system. For each of your turn, you should first think what you "
        'should do, and then take exact one of the three actions: "bash", "finish" or '
        '"answer".\nNow, my problem is:\n{q}'
    )
    asks = [
        "How many files are in /etc?",
        "Find the largest file under /var/log.",
        "Count the users whose shell is bash.",
        "How many lines does /etc/passwd have?",
        "List the processes using the most memory.",
        "Which directory under /home is the biggest?",
        "How many .py files are under /usr/lib?",
        "What is the hostname of this machine?",
    ]
    rows: list[Row | str] = []
    for i, q in enumerate(asks):
        for env in ("os", "db"):
            rows.append(
                {
                    "id": f"{env}_{i}",
                    "conversations": [
                        {"from": "human", "loss": False, "value": intro.format(q=q)},
                        {"from": "gpt", "loss": False, "value": "OK."},
                        {"from": "human", "loss": False, "value": f"[{env}] Task {i}: {q}"},
                        {"from": "gpt", "loss": True, "value": "Think: run a command.\nAct: bash"},
                        {
                            "from": "human",
                            "loss": False,
                            "value": f"The output of the OS:\n{7 * i + 3} entries in {env}_{i}",
                        },
                        {"from": "gpt", "loss": True, "value": f"Act: answer({7 * i + 3})"},
                    ],
                }
            )
    rows += [
        {"id": "os_nouser", "conversations": [{"from": "gpt", "loss": True, "value": "Act: bash"}]},
        {"id": "os_empty", "conversations": []},
    ]
    return rows


def _write_jsonl(path: Path, rows: list[Row | str]) -> None:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_parquet(path: Path, rows: list[Row]) -> None:

    pq.write_table(pa.Table.from_pylist(rows), path)


SAMPLE_FILES = {
    "infinity_instruct": "infinity_instruct_0625.jsonl",
    "webinstruct": "webinstructsub.parquet",
    "codefeedback": "codefeedback.jsonl",
    "metamath": "metamathqa.json",
    "hermes_fc": "hermes_function_calling_v1.jsonl",
    "agentinstruct": "agentinstruct.jsonl",
}
_DOMAINS = {
    "infinity_instruct": "auto",
    "webinstruct": "math",
    "codefeedback": "code",
    "metamath": "math",
    "hermes_fc": "tool",
    "agentinstruct": "agent",
}


def write_sample_sources(directory: Path) -> list[SourceConfig]:
    """Write the six sample sources into ``directory`` (created if missing); return their configs.

    Each SourceConfig names the file by absolute path, its schema and its domain. Calling it
    twice writes the same bytes.
    """
    directory.mkdir(parents=True, exist_ok=True)
    _write_jsonl(directory / SAMPLE_FILES["infinity_instruct"], _infinity())
    _write_parquet(directory / SAMPLE_FILES["webinstruct"], _webinstruct())
    _write_jsonl(directory / SAMPLE_FILES["codefeedback"], _codefeedback())
    (directory / SAMPLE_FILES["metamath"]).write_text(json.dumps(_metamath(), indent=1) + "\n")
    _write_jsonl(directory / SAMPLE_FILES["hermes_fc"], _hermes())
    _write_jsonl(directory / SAMPLE_FILES["agentinstruct"], _agent())
    return [
        SourceConfig(
            name=schema, schema=schema, path=str(directory / file), domain=_DOMAINS[schema]
        )
        for schema, file in SAMPLE_FILES.items()
    ]


def sample_config(directory: Path, out: Path, *, budget: int = 100, seed: int = 0) -> PrepareConfig:
    """The quickstart prepare config over ``write_sample_sources(directory)``'s files.

    The same settings as ``examples/quickstart.yaml``: an existing set of 1,000 rows at 77% code,
    a target mix, a budget of new prompts and near-dedup on (3-gram shingles, threshold 0.7).
    """

    sources = [
        SourceConfig(name=s, schema=s, path=str(directory / f), domain=_DOMAINS[s])
        for s, f in SAMPLE_FILES.items()
    ]
    return PrepareConfig(
        sources=sources,
        out=str(out),
        seed=seed,
        budget=budget,
        mix=dict(QUICKSTART_MIX),
        existing=ExistingConfig(counts=dict(QUICKSTART_EXISTING)),
        dedup=DedupConfig(threshold=0.7, ngram=3),
    )


QUICKSTART_MIX = {"code": 0.5, "math": 0.2, "general": 0.2, "tool": 0.05, "agent": 0.05}
QUICKSTART_EXISTING = {"code": 77, "math": 8, "general": 15}
