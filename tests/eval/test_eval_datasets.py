"""Dataset loaders: every loader on a hand-written file in its data set's layout (tests/assets/), the CRUD split
fixture, Python-literal fields, and errors that name file, line and field; opt-in (``-m slow``), every real file
in ../shared/datasets with its expected counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.eval.datasets import (
    DatasetError,
    Passage,
    QARecord,
    load_cmrc2018,
    load_crud_qa,
    load_hotpotqa,
    load_hotpotqa_corpus,
    load_jsonl,
    load_longbench,
    load_predictions,
    load_references,
)

ASSETS = Path(__file__).resolve().parent / "assets"
SMALL = Path(__file__).resolve().parents[1] / "assets"  # tests/assets/: hand-written, in the public layouts


def test_longbench_layout() -> None:
    records = load_longbench(SMALL / "longbench_multifieldqa_zh_small.jsonl")
    assert [r.id for r in records] == ["lb-small-1", "lb-small-2", "lb-small-3"]
    assert [r.answers for r in records] == [["青川师范学院。"], ["每 3 个月更换一次。"], ["约 12 万吨。"]]
    assert records[0].question.startswith("2023 年青川市中小学校长") and records[1].documents[0].id == "lb-small-2"
    assert [len(r.documents[0].text) for r in records] == [1196, 1228, 277]
    assert records[0].documents[0].text.startswith("青教发〔2023〕15 号 \n") and "\n\n\n\n三、" in records[1].documents[0].text
    assert records[2].meta == {"length": 277, "dataset": "multifieldqa_zh", "language": "zh", "all_classes": None}


def test_cmrc2018_layout() -> None:
    records = load_cmrc2018(SMALL / "cmrc2018_dev_small.json")
    assert [r.id for r in records] == ["DEV_0_QUERY_0", "DEV_0_QUERY_1", "DEV_0_QUERY_2", "DEV_1_QUERY_0",
                                       "DEV_1_QUERY_1", "DEV_1_QUERY_2"]
    assert [r.documents[0].id for r in records] == ["DEV_0"] * 3 + ["DEV_1", "DEV_1_P1", "DEV_1_P1"]
    assert records[0].answers == ["青川师范专科学校"] * 3 and records[2].answers == ["16个", "16个二级学院", "16"]
    assert records[4].meta["title"] == "东岭江隧道" and records[4].documents[0].title == "东岭江隧道"
    for r in records:  # every answer starts where the file says, in its own paragraph
        text = r.documents[0].text
        assert [text[s:s + len(a)] for s, a in zip(r.meta["answer_starts"], r.answers, strict=True)] == r.answers


def test_hotpotqa_layout_and_corpus() -> None:
    records = load_hotpotqa(SMALL / "hotpotqa_small_qa.json")
    corpus = load_hotpotqa_corpus(SMALL / "hotpotqa_small_corpus.json")
    assert [r.answers for r in records] == [["the Arden"], ["the Tamsey Pottery"]]
    assert [r.meta["type"] for r in records] == ["bridge", "comparison"] and records[1].meta["level"] == "medium"
    assert records[0].meta["supporting_facts"] == [["Harwick Clock Museum", 0], ["Millbrook", 1]]
    assert records[0].documents[1] == Passage(
        "Millbrook is a market town in the county of Westshire. The Arden flows through Millbrook. Its market has "
        "been held every Thursday since 1604.", title="Millbrook", id="Millbrook")
    assert len(corpus) == 5 and {d.title for r in records for d in r.documents} == {p.title for p in corpus}
    assert all(f[0] in {d.title for d in r.documents} for r in records for f in r.meta["supporting_facts"])
    assert next(p for p in corpus if p.title == "Millbrook") == records[0].documents[1]


@pytest.mark.slow
def test_longbench_multifieldqa_zh(shared: Path) -> None:
    records = load_longbench(shared / "longbench_multifieldqa_zh.jsonl")
    assert len(records) == 200
    assert all(isinstance(r, QARecord) and len(r.answers) == 1 and r.documents for r in records)
    assert records[0].answers == ["厦门大学。"] and records[0].question.startswith("全国美国文学研究会")
    assert len({r.id for r in records}) == 200
    assert all(len(r.documents[0].text) > 1000 and r.meta["language"] == "zh" for r in records)


@pytest.mark.slow
def test_cmrc2018(shared: Path) -> None:
    records = load_cmrc2018(shared / "cmrc2018_dev.json")
    assert len(records) == 3219
    assert len({r.documents[0].id for r in records}) == 848
    first = records[0]
    assert first.id == "DEV_0_QUERY_0" and first.answers == ["光荣和ω-force"] * 3
    assert first.documents[0].text[first.meta["answer_starts"][0]:].startswith("光荣和ω-force")


@pytest.mark.slow
def test_hotpotqa_and_corpus(shared: Path) -> None:
    records = load_hotpotqa(shared / "hotpotqa_100_qa.json")
    corpus = load_hotpotqa_corpus(shared / "hotpotqa_100_corpus.json")
    assert len(records) == 100 and len(corpus) == 994
    assert records[0].answers == ["a spirit"] and records[0].meta["type"] == "bridge"
    titles = {p.title for p in corpus}
    assert {d.title for r in records for d in r.documents} == titles
    assert all(f[0] in {d.title for d in r.documents} for r in records for f in r.meta["supporting_facts"])


def test_crud_split_fixture() -> None:
    path = ASSETS / "crud_split_merged_small.json"
    one, two, three = (load_crud_qa(path, split) for split in ("1doc", "2docs", "3docs"))
    assert [len(one), len(two), len(three)] == [2, 1, 2]
    assert [len(r.documents) for r in one + two + three] == [1, 1, 2, 3, 3]
    assert three[0].documents[2] == Passage("赛事期间，全市共投入志愿者4500名，设置补给站20个。", id="news3")
    assert one[0].question == "某市地铁9号线全长多少公里？" and one[0].answers == ["某市地铁9号线全长28公里。"]
    assert load_crud_qa(path, "2docs")[0].meta == {"split": "2docs", "event": "某省发布春耕生产情况"}
    with pytest.raises(ValueError, match="unknown CRUD QA split '4docs'"):
        load_crud_qa(path, "4docs")


def test_python_literal_fields() -> None:
    records = load_longbench(ASSETS / "longbench_literal.jsonl")
    assert [r.answers for r in records] == [["厦门大学。"], ["上海和杭州", "上海、杭州"]]
    hotpot = load_hotpotqa(ASSETS / "hotpotqa_literal.json")[0]
    assert hotpot.meta["supporting_facts"] == [["City Museum", 0], ["Riverton", 1]]
    assert hotpot.documents[1] == Passage("Riverton is a port town. The Elbe flows through Riverton.",
                                          title="Riverton", id="Riverton")


def test_generic_jsonl_with_mapping(tmp_path: Path) -> None:
    path = tmp_path / "custom.jsonl"
    rows = [{"qid": 7, "q": "谁？", "gold": "张三", "docs": [{"title": "甲", "text": "张三来了。"}], "src": "x"},
            {"qid": "b", "q": "哪里？", "gold": ["北京", "京城"], "docs": "在北京。"}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    records = load_jsonl(path, id="qid", question="q", answers="gold", documents="docs")
    assert [r.id for r in records] == ["7", "b"] and records[1].answers == ["北京", "京城"]
    assert records[0].documents == [Passage("张三来了。", title="甲", id="0")] and records[0].meta == {"src": "x"}
    assert [r.id for r in load_jsonl(path, id=None, question="q", answers="gold")] == ["1", "2"]


def _write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


GOOD = '{"_id": "a", "input": "问", "context": "文", "answers": ["答"]}'


@pytest.mark.parametrize(
    ("content", "line", "field", "message"),
    [
        (GOOD + '\n{"_id": "b", "context": "文", "answers": ["答"]}\n', 2, "input", "missing"),
        (GOOD + '\n\n{"_id": "b", "input": "问", "context": "文", "answers": 5}\n', 3, "answers", "expected a list"),
        (GOOD + '\n{"_id": "b", "input": "问", "context": "文", "answers": "[\'答\'"}\n', 2, "answers", "Python literal"),
        (GOOD + '\n{"_id": "b", "input": "问", "context": "文", "answers": "__import__(\'os\')"}\n', 2, "answers", "literal"),
        (GOOD + '\n{"_id": "b", "input": ["问"], "context": "文", "answers": ["答"]}\n', 2, "input", "expected str"),
        (GOOD + '\n{"_id": "b", "input": "问", "context": "文", "answers": []}\n', 2, "answers", "empty list"),
        (GOOD + '\n{"_id": "b", "input": "问", "cont', 2, None, "truncated"),
    ],
    ids=["missing field", "wrong type", "broken literal", "code is not a literal", "list for str", "no answers",
         "truncated"],
)
def test_bad_jsonl_names_file_line_field(tmp_path: Path, content: str, line: int, field: str | None, message: str) -> None:
    path = _write(tmp_path, "bad.jsonl", content)
    with pytest.raises(DatasetError, match=message) as info:
        load_longbench(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert (info.value.line, info.value.field) == (line, field)


def test_non_utf8_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path, "latin.jsonl", GOOD.encode() + b"\n" + GOOD.encode() + b"\n" + '{"_id": "caf\xe9"}'.encode("latin-1"))
    with pytest.raises(DatasetError, match=r"byte 0xe9 at column 13 is not UTF-8") as info:
        load_longbench(path)
    assert info.value.line == 3 and str(path) in str(info.value)


def test_bad_json_files_name_the_line(tmp_path: Path) -> None:
    rest = '"answer": "甲", "supporting_facts": [], "context": []}'
    items = f'[\n  {{"_id": "a", "question": "一", {rest},\n  {{"_id": "b", "question": 2, {rest}\n]\n'
    with pytest.raises(DatasetError, match="expected str") as info:
        load_hotpotqa(_write(tmp_path, "types.json", items))
    assert (info.value.line, info.value.field) == (3, "question")
    with pytest.raises(DatasetError, match="truncated") as info:
        load_hotpotqa(_write(tmp_path, "cut.json", items[:120]))
    assert info.value.line == 3
    with pytest.raises(DatasetError, match="expected a JSON array"):
        load_hotpotqa(_write(tmp_path, "obj.json", '{"question": "一"}'))
    squad = {"data": [{"title": "t", "paragraphs": [{"id": "p", "context": "c", "qas": [
        {"id": "q", "question": "?", "answers": [{"answer_start": 0}]}]}]}]}
    with pytest.raises(DatasetError, match="missing") as info:
        load_cmrc2018(_write(tmp_path, "squad.json", json.dumps(squad, indent=1)))
    assert info.value.field == "paragraphs[0].qas[0].answers[0].text" and info.value.line == 3
    with pytest.raises(DatasetError, match="top-level object with key 'questanswer_2docs'"):
        load_crud_qa(_write(tmp_path, "crud.json", '{"questanswer_1doc": []}'), "2docs")


def test_predictions_and_references(tmp_path: Path) -> None:
    preds = _write(tmp_path, "p.jsonl", '{"id": 1, "prediction": "甲"}\n{"id": "2", "prediction": "乙"}\n')
    refs = _write(tmp_path, "r.jsonl", '{"id": "1", "answer": "甲"}\n{"id": 2, "answers": ["乙", "丙"]}\n')
    assert load_predictions(preds) == {"1": "甲", "2": "乙"}
    assert load_references(refs) == {"1": ["甲"], "2": ["乙", "丙"]}
    dup = _write(tmp_path, "d.jsonl", '{"id": 1, "prediction": "甲"}\n{"id": "1", "prediction": "乙"}\n')
    with pytest.raises(DatasetError, match=r"duplicate id '1' \(first on line 1\)"):
        load_predictions(dup)
    both = _write(tmp_path, "b.jsonl", '{"id": 1, "answer": "甲", "answers": ["乙"]}\n')
    with pytest.raises(DatasetError, match="exactly one of 'answer'"):
        load_references(both)
    with pytest.raises(DatasetError, match="cannot read the file"):
        load_longbench(tmp_path / "absent.jsonl")
