"""Classification files, the ListOps generator, and trajectory windows."""

import inspect
import json
import re

import grain
import jax.numpy as jnp
import numpy as np
import pytest

import lineax_seq as ls

# ------------------------------------------------------------------- classification files


def _write_csv(path, rows, header="text,label"):
    path.write_text(header + "\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def test_read_classification_csv_and_jsonl(tmp_path):
    csv_path = _write_csv(tmp_path / "d.csv", [("good film", 1), ("bad film", 0), ("meh", 2)])
    ds = ls.read_classification(csv_path, num_classes=3)
    assert [ds[i] for i in range(3)] == [
        {"text": "good film", "label": 1},
        {"text": "bad film", "label": 0},
        {"text": "meh", "label": 2},
    ]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps({"premise": f"p{i}", "hyp": f"h{i}", "y": i % 3}) for i in range(5))
    )
    pairs = ls.read_classification(
        jsonl, num_classes=3, text_field="premise", label_field="y", pair_field="hyp"
    )
    assert pairs[4] == {"text": "p4", "label": 1, "text_pair": "h4"}
    tok = ls.ByteTokenizer()
    batch = next(iter(ls.classification_dataset(pairs, tok, length=8, batch_size=5, shuffle=False)))
    assert batch["tokens"].shape == batch["padding_mask"].shape == (5, 8)
    assert batch["label"].dtype == np.int32
    np.testing.assert_array_equal(batch["label"], [0, 1, 2, 0, 1])
    expected = [tok.cls_id, *tok.encode("p0"), tok.sep_id, *tok.encode("h0"), tok.sep_id, 0]
    np.testing.assert_array_equal(batch["tokens"][0], expected)
    np.testing.assert_array_equal(batch["padding_mask"][0], [True] * 7 + [False])
    # BERT's segment ids: 1 on "h0 <sep>", 0 on "<cls> p0 <sep>" and the padding.
    np.testing.assert_array_equal(batch["token_types"][0], [0, 0, 0, 0, 1, 1, 1, 0])
    assert batch["token_types"].dtype == np.int32
    # Regression: float labels.
    reg = ls.read_classification(
        _write_csv(tmp_path / "r.csv", [("a", 0.5), ("b", -1.25)]), num_classes=None
    )
    assert reg[1]["label"] == -1.25
    rb = next(iter(ls.classification_dataset(reg, tok, length=4, batch_size=2, shuffle=False)))
    assert rb["label"].dtype == np.float32
    np.testing.assert_allclose(rb["label"], [0.5, -1.25])


def test_read_classification_named_labels(tmp_path):
    """Class names (MNLI's "entailment", ...) map to their index in `label_names`."""
    names = ("entailment", "neutral", "contradiction")
    path = _write_csv(tmp_path / "nli.csv", [("a", "neutral"), ("b", " contradiction "),
                                            ("c", "entailment")])  # fmt: skip
    ds = ls.read_classification(path, num_classes=None, label_names=names)
    assert [ds[i]["label"] for i in range(3)] == [1, 2, 0]
    assert ls.read_classification(path, num_classes=3, label_names=list(names))[0]["label"] == 1
    jsonl = tmp_path / "nli.jsonl"
    jsonl.write_text(json.dumps({"text": "x", "label": "entailment"}) + "\n")
    assert ls.read_classification(jsonl, num_classes=None, label_names=names)[0]["label"] == 0
    with pytest.raises(ValueError, match=r"nli.csv:3: label ' contradiction ' is not one of"):
        ls.read_classification(path, num_classes=None, label_names=("entailment", "neutral"))
    with pytest.raises(ValueError, match=r"num_classes=2 does not match the 3 label_names"):
        ls.read_classification(path, num_classes=2, label_names=names)
    with pytest.raises(
        ValueError, match=r"at least 2 distinct names, got label_names=\('a', 'a'\)"
    ):
        ls.read_classification(path, num_classes=None, label_names=("a", "a"))
    for bad in ("ab", ("a", " b"), ("a", "")):
        with pytest.raises(ValueError, match="label_names must be a sequence of non-empty"):
            ls.read_classification(path, num_classes=None, label_names=bad)
    whole = _write_csv(tmp_path / "w.csv", [("a", "2.0"), ("b", "1")])
    assert [r["label"] for r in ls.read_classification(whole, num_classes=3)] == [2, 1]
    with pytest.raises(ValueError, match="label '1.5' is not an integer"):
        ls.read_classification(_write_csv(tmp_path / "h.csv", [("a", "1.5")]), num_classes=3)


def test_read_classification_encodings_and_json_values(tmp_path):
    bom = tmp_path / "excel.csv"  # Excel writes UTF-8 with a byte-order mark
    bom.write_text("text,label\ncafé,1\n", encoding="utf-8-sig")
    assert ls.read_classification(bom, num_classes=2)[0] == {"text": "café", "label": 1}
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"text,label\nok,0\ncaf\xe9,1\n")
    with pytest.raises(ValueError, match=r"latin.csv:3: not UTF-8 text"):
        ls.read_classification(latin, num_classes=2)
    for line in ("[1, 2]", '"text"', "3"):
        p = tmp_path / "values.jsonl"
        p.write_text(json.dumps({"text": "x", "label": 1}) + "\n" + line + "\n")
        with pytest.raises(ValueError, match=r"values.jsonl:2: not a JSON object \(got "):
            ls.read_classification(p, num_classes=2)


def test_read_classification_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match=r"d.csv:3: label '5' is outside the class range \[0, 3\)"):
        ls.read_classification(_write_csv(tmp_path / "d.csv", [("x", 1), ("y", 5)]), num_classes=3)
    with pytest.raises(ValueError, match="label -1 is outside the class range"):
        p = tmp_path / "n.jsonl"
        p.write_text(json.dumps({"text": "x", "label": -1}) + "\n")
        ls.read_classification(p, num_classes=2)
    with pytest.raises(ValueError, match="label 'pos' is not an integer"):
        ls.read_classification(_write_csv(tmp_path / "s.csv", [("x", "pos")]), num_classes=2)
    with pytest.raises(ValueError, match="label True is a boolean, not an integer class index"):
        p = tmp_path / "b.jsonl"
        p.write_text(json.dumps({"text": "x", "label": True}) + "\n")
        ls.read_classification(p, num_classes=2)
    with pytest.raises(ValueError, match="label 'nan' is not a finite number"):
        ls.read_classification(_write_csv(tmp_path / "f.csv", [("x", "nan")]), num_classes=None)
    with pytest.raises(ValueError, match="missing field 'label'; its fields are 'text', 'y'"):
        ls.read_classification(
            _write_csv(tmp_path / "h.csv", [("x", 1)], header="text,y"), num_classes=2
        )
    with pytest.raises(ValueError, match="missing field 'label'; its fields are 'text', ' label'"):
        ls.read_classification(
            _write_csv(tmp_path / "h.csv", [("x", 1)], header="text, label"), num_classes=2
        )
    with pytest.raises(ValueError, match="b.jsonl:2: not a JSON object"):
        p = tmp_path / "b.jsonl"
        p.write_text(json.dumps({"text": "x", "label": 1}) + "\n{'text': 'y'}\n")
        ls.read_classification(p, num_classes=2)
    with pytest.raises(FileNotFoundError, match="path"):
        ls.read_classification(tmp_path / "missing.csv", num_classes=2)
    with pytest.raises(ValueError, match="contains no examples"):
        ls.read_classification(_write_csv(tmp_path / "e.csv", []), num_classes=2)
    with pytest.raises(ValueError, match="num_classes must be an integer >= 2, got num_classes=1"):
        ls.read_classification(tmp_path / "d.csv", num_classes=1)


def test_read_classification_plain_numbers_blank_lines_and_suffix_case(tmp_path):
    """Labels are plain decimal numbers (Python's `float` read "1_0" as class 10); a
    line of spaces is blank, as an empty one (it was a row of one field); `.CSV` and
    `.JSONL` are CSV and JSONL files (they were refused)."""
    with pytest.raises(ValueError, match=r"q.csv:2: label '1_0' is not an integer"):
        ls.read_classification(_write_csv(tmp_path / "q.csv", [("x", "1_0")]), num_classes=20)
    with pytest.raises(ValueError, match=r"label '1_0.5' is not a number"):
        ls.read_classification(_write_csv(tmp_path / "r.csv", [("x", "1_0.5")]), num_classes=None)
    upper = tmp_path / "u.CSV"
    upper.write_text("text,label\nhi,1\n   \n\n,\nyo, 2e0 \n")
    got = ls.read_classification(upper, num_classes=3)
    assert [got[i] for i in range(len(got))] == [
        {"text": "hi", "label": 1},
        {"text": "yo", "label": 2},
    ]
    jsonl = tmp_path / "v.JSONL"
    jsonl.write_text(json.dumps({"text": "a", "label": " -2.5 "}) + "\n  \n")
    assert ls.read_classification(jsonl, num_classes=None)[0]["label"] == -2.5


def test_read_classification_csv_rows_must_match_the_header(tmp_path):
    """csv.DictReader files extra fields under the key None: an unquoted comma in a text
    changed the label (`meh, 0,1` read as text 'meh', label 0)."""
    path = tmp_path / "c.csv"
    path.write_text("text,label\ngood,1\nmeh, 0,1\n")
    with pytest.raises(
        ValueError,
        match=r"c.csv:3: 3 field\(s\), but the header has 2 \(text,label\); quote a text",
    ):
        ls.read_classification(path, num_classes=2)
    path.write_text("text,label,source\ngood,1,web\nmeh,1\n")  # too few (an optional one)
    with pytest.raises(ValueError, match=r"c.csv:3: 2 field\(s\), but the header has 3"):
        ls.read_classification(path, num_classes=2)
    path.write_text("text,label,text\na,1,b\n")  # DictReader kept the last 'text'
    with pytest.raises(ValueError, match=r"c.csv:1: the header names column 'text' 2 times"):
        ls.read_classification(path, num_classes=2)
    # Quoted commas and newlines, blank lines and the line of a multi-line row still work.
    path.write_text('text,label\n"a, b",1\n\n"two\nlines",0\nc,5\n')
    with pytest.raises(ValueError, match=r"c.csv:6: label '5' is outside"):
        ls.read_classification(path, num_classes=2)
    ds = ls.read_classification(path, num_classes=6)
    assert [ds[i] for i in range(3)] == [
        {"text": "a, b", "label": 1},
        {"text": "two\nlines", "label": 0},
        {"text": "c", "label": 5},
    ]


def test_read_classification_long_csv_field_names_the_line(tmp_path):
    import csv

    limit = csv.field_size_limit()
    path = tmp_path / "long.csv"
    path.write_text(f"text,label\nshort,1\n{'x' * (limit + 1)},0\n")
    with pytest.raises(
        ValueError, match=rf"long.csv:3: a field is longer than the csv module's limit of {limit}"
    ):
        ls.read_classification(path, num_classes=2)
    assert csv.field_size_limit() == limit  # no process-wide setting was changed
    jsonl = tmp_path / "long.jsonl"  # JSONL has no such limit
    jsonl.write_text(json.dumps({"text": "x" * (limit + 1), "label": 1}) + "\n")
    assert len(ls.read_classification(jsonl, num_classes=2)[0]["text"]) == limit + 1


def test_read_classification_json_values_of_texts_and_labels(tmp_path):
    path = tmp_path / "v.jsonl"
    ok = json.dumps({"text": "x", "pair": "y", "label": 1})
    for field, value in (("text", ["a"]), ("text", 3), ("text", None), ("pair", 2.5)):
        path.write_text(ok + "\n" + json.dumps({"text": "x", "pair": "y", "label": 1,
                                                field: value}) + "\n")  # fmt: skip
        with pytest.raises(
            ValueError,
            match=rf"v.jsonl:2: field '{field}' must be a string, got {re.escape(repr(value))}",
        ):
            ls.read_classification(path, num_classes=2, pair_field="pair")
    with pytest.raises(ValueError, match="pair_field must be a field name .* got pair_field=''"):
        ls.read_classification(path, num_classes=2, pair_field="")
    # Half an emoji (json.dumps escapes it as "\\ud83d") is named here, not left for the
    # tokenizer's UnicodeEncodeError while batching.
    path.write_text(ok + "\n" + json.dumps({"text": "x", "pair": "cut \ud83d", "label": 0}))
    with pytest.raises(ValueError, match=r"v.jsonl:2: field 'pair' holds '\\ud83d', half of a"):
        ls.read_classification(path, num_classes=2, pair_field="pair")
    # Regression: JSON integers beyond int64 are numbers like any other.
    path.write_text(json.dumps({"text": "x", "label": 10**30}) + "\n")
    assert ls.read_classification(path, num_classes=None)[0]["label"] == 1e30
    path.write_text(json.dumps({"text": "x", "label": -(10**300)}) + "\n")
    with pytest.raises(ValueError, match=r"v.jsonl:1: label -1000* is beyond the float32 range"):
        ls.read_classification(path, num_classes=None)
    path.write_text(json.dumps({"text": "x", "label": 10**400}) + "\n")
    with pytest.raises(ValueError, match=r"v.jsonl:1: label 1000* is not a finite number"):
        ls.read_classification(path, num_classes=None)
    path.write_text('{"text": "x", "label": ' + "1" * 5000 + "}\n")
    with pytest.raises(ValueError, match=r"v.jsonl:1: not a JSON object \(Exceeds the limit"):
        ls.read_classification(path, num_classes=None)


def test_classification_dataset_checks_the_first_record():
    tok = ls.ByteTokenizer()
    make = lambda records, **kw: ls.classification_dataset(
        grain.MapDataset.source(records), tok, length=8, batch_size=1, **kw
    )
    for records, message in (
        (["text"], r"records\[0\] must be a dict \{\"text\": str, .* got str"),
        ([{"text": "a"}], r"records\[0\] has no 'label' \(keys \['text'\]\)"),
        ([{"label": 1}], r"records\[0\] has no 'text'"),
        ([{"text": 3, "label": 1}], r"records\[0\]\['text'\] must be a string, got 3"),
        ([{"text": "a", "text_pair": None, "label": 1}], r"\['text_pair'\] must be a string"),
        ([{"text": "a", "label": "1"}], r"records\[0\]\['label'\] must be an int .* got '1'"),
        ([{"text": "a", "label": True}], r"records\[0\]\['label'\] must be an int .* got True"),
        ([None], r"records\[0\] must be a dict .* got NoneType"),
        ([], "records is empty"),
    ):
        with pytest.raises(ValueError, match=message):
            make(records)
    pair = [{"text": "a", "text_pair": "b", "label": 1}]
    with pytest.raises(ValueError, match="records\\[0\\] has a 'text_pair', which add_special"):
        make(pair, add_special_tokens=False)
    with pytest.raises(ValueError, match="truncation must be one of .* got truncation='start'"):
        make(pair, truncation="start")
    # Only the first record is read up front: a generated dataset is not built eagerly.
    reads = []

    def record(i):
        reads.append(i)
        return {"text": "a", "label": 0}

    ls.classification_dataset(grain.MapDataset.range(10**9).map(record), tok, length=8,
                              batch_size=2)  # fmt: skip
    assert reads == [0]
    # The others are checked as they are read (a pair was dropped, "2" read as class 2).
    good = {"text": "a", "label": 1}
    for later, message in (
        ({"text": "a", "text_pair": "b", "label": 1}, r"records\[2\] has a 'text_pair'"),
        ({"text": "a", "label": "2"}, r"records\[2\]\['label'\] must be an int"),
        ({"text": "a"}, r"records\[2\] has no 'label'"),
    ):
        data = make([good, good, later], add_special_tokens=False, shuffle=False, num_epochs=1)
        with pytest.raises(ValueError, match=message):
            list(data)
    # A later epoch names the record it reads (grain's index runs on past the end).
    data = make([good, good, {"text": "a", "label": 0.5}], shuffle=False)
    iterator = iter(data)
    iterator.set_state({"next_index": 4})
    with pytest.raises(ValueError, match=r"records\[2\]\['label'\] 0.5 is not a whole"):
        next(iterator), next(iterator)


def test_classification_dataset_length_leaves_room_for_text():
    tok = ls.ByteTokenizer()
    single = grain.MapDataset.source([{"text": "hello", "label": 0}])
    pair = grain.MapDataset.source([{"text": "hello", "text_pair": "there", "label": 0}])
    for records, short in ((single, 2), (pair, 4)):
        with pytest.raises(ValueError, match=rf"length={short} leaves no room for a .*>= "):
            ls.classification_dataset(records, tok, length=short, batch_size=1)
        batch = next(iter(ls.classification_dataset(records, tok, length=short + 1,
                                                    batch_size=1, shuffle=False)))  # fmt: skip
        assert tok.encode("h")[0] in batch["tokens"] and batch["padding_mask"].all()
    # Without special tokens one token is a text.
    batch = next(iter(ls.classification_dataset(single, tok, length=1, batch_size=1,
                                                add_special_tokens=False)))  # fmt: skip
    np.testing.assert_array_equal(batch["tokens"], [tok.encode("h")])
    # A pair later in the records is refused as it is read.
    mixed = grain.MapDataset.source([{"text": "hello", "label": 0}, pair[0]])
    data = ls.classification_dataset(mixed, tok, length=4, batch_size=2, shuffle=False)
    with pytest.raises(ValueError, match=r"length=4 leaves no room for a sentence pair in rec"):
        next(iter(data))


def test_classification_dataset_label_dtype_follows_the_first_record():
    tok = ls.ByteTokenizer()

    def labels(values):
        records = grain.MapDataset.source([{"text": "a", "label": v} for v in values])
        data = ls.classification_dataset(records, tok, length=4, batch_size=len(values),
                                         shuffle=False, num_epochs=1)  # fmt: skip
        return next(iter(data))["label"]

    mixed = labels([0.5, 1, np.int64(2)])  # was float64: int32 and float32 stacked
    assert mixed.dtype == np.float32
    np.testing.assert_array_equal(mixed, [0.5, 1.0, 2.0])
    classes = labels([1, 2.0, np.float64(0.0)])  # whole-number floats among class ids
    assert classes.dtype == np.int32
    np.testing.assert_array_equal(classes, [1, 2, 0])
    with pytest.raises(
        ValueError, match=r"records\[1\]\['label'\] 0.5 is not a whole number, but the first"
    ):
        labels([1, 0.5])
    # 0-d arrays (e.g. `jnp.asarray(ys)[i]`) are labels too, by their dtype.
    np.testing.assert_array_equal(labels([np.asarray(2), jnp.asarray(1)]), [2, 1])
    assert labels([jnp.asarray(0.5), np.asarray(1)]).dtype == np.float32
    # Values that read_classification refuses, named here too (batched silently, or a
    # bare OverflowError, before).
    for values, message in [
        ([1, -1], r"records\[1\]\['label'\] -1 is not a class id"),
        ([1, 2**40], r"records\[1\]\['label'\] 1099511627776 is not a class id"),
        ([0.5, float("nan")], r"records\[1\]\['label'\] nan is not a finite float32"),
        ([0.5, 1e39], r"records\[1\]\['label'\] 1e\+39 is not a finite float32"),
    ]:
        with pytest.raises(ValueError, match=message):
            labels(values)


def _longest_first_oracle(a, b, budget):
    """Hugging Face's "longest_first", literally: drop the last token of the longer
    sequence (the second on a tie) until the two fit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def test_classification_dataset_pair_truncation():
    tok = ls.ByteTokenizer()
    cls, sep, pad = tok.cls_id, tok.sep_id, tok.pad_id
    letters = "abcdefghijklmnopqrstuvwxyz"
    sizes = (0, 1, 2, 5, 6, 7, 12, 30)
    records = [
        {"text": letters[:n], "text_pair": letters.upper()[:m], "label": i % 2}
        for i, (n, m) in enumerate((n, m) for n in sizes for m in sizes)
    ]
    for length in (5, 6, 9, 16):  # 3 and 4 leave no room for a pair
        longest, end = (
            next(iter(ls.classification_dataset(
                grain.MapDataset.source(records), tok, length=length, batch_size=len(records),
                shuffle=False, num_epochs=1, truncation=truncation,
            )))
            for truncation in ("longest_first", "end")
        )  # fmt: skip
        for i, r in enumerate(records):
            a, b = tok.encode(r["text"]).tolist(), tok.encode(r["text_pair"]).tolist()
            ta, tb = _longest_first_oracle(a, b, length - 3)
            ids = [cls, *ta, sep, *tb, sep]
            expected = ids + [pad] * (length - len(ids))
            np.testing.assert_array_equal(longest["tokens"][i], expected, err_msg=str(r))
            assert longest["padding_mask"][i].sum() == len(ids)
            types = [0] * (len(ta) + 2) + [1] * (len(tb) + 1)
            np.testing.assert_array_equal(
                longest["token_types"][i], types + [0] * (length - len(ids))
            )
            # "end" cuts the encoded pair at the end (the committed results').
            whole = [cls, *a, sep, *b, sep][:length]
            np.testing.assert_array_equal(end["tokens"][i], whole + [pad] * (length - len(whole)))
            types = ([0] * (len(a) + 2) + [1] * (len(b) + 1))[:length]
            types += [0] * (length - len(types))
            np.testing.assert_array_equal(end["token_types"][i], types)
    # The default is BERT's and Hugging Face's (it was "end": a long premise dropped the
    # hypothesis); the experiments pass their own, "end", the committed results'.
    default = inspect.signature(ls.classification_dataset).parameters["truncation"].default
    assert default == "longest_first"
    # A 50-character premise at length 16: "end" leaves no hypothesis and no separator.
    premise = {"text": "p" * 50, "text_pair": "short hyp", "label": 0}
    for truncation, expected in (
        ("end", [cls, *tok.encode("p" * 15)]),
        ("longest_first", [cls, *tok.encode("p" * 7), sep, *tok.encode("short "), sep]),
    ):
        data = ls.classification_dataset(grain.MapDataset.source([premise]), tok, length=16,
                                         batch_size=1, truncation=truncation)  # fmt: skip
        np.testing.assert_array_equal(next(iter(data))["tokens"][0], expected)
    # A single text keeps its <sep> with "longest_first".
    single = grain.MapDataset.source([{"text": "q" * 20, "label": 1}])
    data = ls.classification_dataset(single, tok, length=6, batch_size=1,
                                     truncation="longest_first")  # fmt: skip
    batch = next(iter(data))
    np.testing.assert_array_equal(batch["tokens"][0], [cls, *tok.encode("qqqq"), sep])
    np.testing.assert_array_equal(batch["token_types"][0], [0] * 6)  # one segment


# ------------------------------------------------------------------------------ ListOps


def _evaluate(tokens):
    """Independent evaluator: recursive descent over the token list."""
    ops = {
        "[MIN": min,
        "[MAX": max,
        "[MED": lambda v: int(np.floor(np.median(v))),
        "[SM": lambda v: sum(v) % 10,
    }
    stats = {"max_depth": 0, "arg_counts": []}

    def parse(i, depth):
        stats["max_depth"] = max(stats["max_depth"], depth)
        t = tokens[i]
        if t.isdigit():
            return int(t), i + 1
        assert t in ops, t
        args, i = [], i + 1
        while tokens[i] != "]":
            v, i = parse(i, depth + 1)
            args.append(v)
        stats["arg_counts"].append(len(args))
        return ops[t](args), i + 1

    value, end = parse(0, 0)
    assert end == len(tokens)
    return value, stats


@pytest.fixture(scope="module")
def listops_small():
    return ls.listops(40, seed=0, min_length=50, max_length=400)


def test_listops_defaults_draw_lra_trees():
    """LRA's generator (`generate_tree(1, max_depth=10)`) counts the root at depth 1, so
    its trees nest at most 9 operators, and at its lengths nearly all reach 9; the
    defaults nested 10."""
    data = ls.listops(12, seed=3)
    nesting = []
    for i in range(len(data)):
        tokens = data[i]["text"].split()
        assert 500 <= len(tokens) <= 2000
        depth = np.cumsum([t.startswith("[") - (t == "]") for t in tokens])
        nesting.append(int(depth.max()))
    assert max(nesting) == 9


def test_listops_labels_match_an_independent_evaluator(listops_small):
    labels = []
    for i in range(len(listops_small)):
        ex = listops_small[i]
        tokens = ex["text"].split()
        assert 50 <= len(tokens) <= 400
        value, stats = _evaluate(tokens)
        assert ex["label"] == value
        assert stats["max_depth"] <= 9
        assert all(2 <= c <= 10 for c in stats["arg_counts"])
        labels.append(value)
    assert len(set(labels)) >= 5  # several of the 10 classes occur


def test_listops_default_lengths_and_tokenizer():
    ds = ls.listops(3, seed=1)  # LRA defaults: 500-2000 tokens
    tok = ls.ListOpsTokenizer()
    assert tok.vocab_size == 22
    for i in range(3):
        text = ds[i]["text"]
        ids = tok.encode(text)
        assert 500 <= ids.size <= 2000
        assert ids.min() >= 7 and tok.unk_id not in ids
        assert tok.decode(ids) == text
        assert _evaluate(text.split())[0] == ds[i]["label"]
    batch = next(
        iter(
            ls.classification_dataset(
                ds, tok, length=2000, batch_size=3, add_special_tokens=False, shuffle=False
            )
        )
    )
    assert batch["tokens"].shape == (3, 2000)
    np.testing.assert_array_equal(
        batch["padding_mask"].sum(1), [len(ds[i]["text"].split()) for i in range(3)]
    )


def test_listops_deterministic_per_seed(listops_small):
    again = ls.listops(40, seed=0, min_length=50, max_length=400)
    other = ls.listops(40, seed=1, min_length=50, max_length=400)
    assert [again[i] for i in (0, 7, 39)] == [listops_small[i] for i in (0, 7, 39)]
    assert [other[i]["text"] for i in range(5)] != [listops_small[i]["text"] for i in range(5)]


def test_listops_bad_inputs():
    with pytest.raises(ValueError, match=r"ids must be in \[0, vocab_size=22\), got id 22"):
        ls.ListOpsTokenizer().decode([7, 22])
    with pytest.raises(ValueError, match="min_length <= max_length"):
        ls.listops(10, min_length=100, max_length=50)
    with pytest.raises(
        ValueError, match="num_examples must be a positive integer, got num_examples=0"
    ):
        ls.listops(0)
    with pytest.raises(ValueError, match="max_args must be an integer >= 2, got max_args=1"):
        ls.listops(10, max_args=1)


def test_listops_lengths_match_an_enumeration():
    """The token counts the up-front check allows are exactly those of the grammar,
    enumerated here over every multiset of argument lengths."""
    import functools
    import itertools

    from lineax_seq.data._classification import _listops_lengths

    def enumerate_lengths(max_depth, max_args, branch_prob, max_length):
        @functools.cache
        def node(depth):
            out = {1} if depth > 0 else set()
            if depth < max_depth and (depth == 0 or branch_prob > 0):
                for k in range(2, max_args + 1):
                    for args in itertools.combinations_with_replacement(node(depth + 1), k):
                        out.add(2 + sum(args))
            return frozenset(n for n in out if n <= max_length)

        return sorted(node(0))

    for max_depth, max_args, branch_prob in itertools.product((1, 2, 3), (2, 3, 4), (0, 0.5)):
        got = np.flatnonzero(_listops_lengths(max_depth, max_args, branch_prob, 40)).tolist()
        assert got == enumerate_lengths(max_depth, max_args, branch_prob, 40)
    # and the generator's samples have such lengths
    allowed = set(np.flatnonzero(_listops_lengths(3, 2, 0.5, 60)).tolist())
    data = ls.listops(50, min_length=4, max_length=60, max_depth=3, max_args=2, branch_prob=0.5)
    assert {len(data[i]["text"].split()) for i in range(50)} <= allowed


def test_listops_checks_its_arguments_up_front():
    for bad, message in (
        ({"seed": -1}, "seed must be an integer >= 0, got seed=-1"),
        ({"seed": True}, "seed must be an integer >= 0, got seed=True"),
        ({"num_examples": True}, "num_examples must be a positive integer, got num_examples=True"),
        # One operator over at most 10 digits: 12 tokens, never the default 500.
        (
            {"max_depth": 1},
            "min_length=500 cannot be reached: .*max_depth=1, max_args=10 have at most 12 tokens",
        ),
        (
            {"min_length": 13, "branch_prob": 0},
            "max_args=10 and branch_prob=0 have at most 12 tokens",
        ),
        ({"min_length": 11, "max_depth": 2, "max_args": 2}, "have at most 10 tokens"),
    ):
        with pytest.raises(ValueError, match=message):
            ls.listops(**{"num_examples": 4, **bad})
    # A range inside the bound that no expression hits (2 arguments: 4, 7, 10, ... tokens)
    # is refused up front too, not by a RuntimeError on the first read.
    with pytest.raises(ValueError, match="no expression .* between min_length=5 and max_len"):
        ls.listops(1, min_length=5, max_length=6, max_depth=2, max_args=2, branch_prob=0.5)
    # A reachable range that the grammar almost never draws (every read took 100,000
    # redraws, seconds, then a RuntimeError) is refused up front as well.
    with pytest.raises(ValueError, match="rarely have between min_length=150 and max_length=187"):
        ls.listops(4, min_length=150, max_length=187, max_depth=3, max_args=5)
    # The bound is exact: depth 2 with 2 arguments, [OP [OP d d ] [OP d d ] ], is 10 tokens.
    deepest = ls.listops(2, min_length=10, max_length=10, max_depth=2, max_args=2, branch_prob=0.9)
    assert len(deepest[1]["text"].split()) == 10
    flat = ls.listops(2, min_length=4, max_length=12, max_depth=np.int64(3), branch_prob=0)
    assert flat[0]["text"].count("[") == 1  # branch_prob=0 (an int): only the root
    records = ls.listops(4, min_length=4, max_length=20)
    with pytest.raises(ValueError, match="length must be a positive integer, got length=True"):
        ls.classification_dataset(records, ls.ListOpsTokenizer(), length=True, batch_size=2)


# ------------------------------------------------------------------------- trajectories


@pytest.fixture(scope="module")
def trajectories():
    n, total = 10, 12
    # states[n, t] = (n, t, -t): every window identifies itself.
    grid = np.stack(np.meshgrid(np.arange(n), np.arange(total), indexing="ij"), -1)
    states = np.concatenate([grid, -grid[..., 1:]], -1).astype(np.float32)
    actions = (100 * grid[..., :1] + grid[..., 1:]).astype(np.float32)
    return states, actions


@pytest.mark.parametrize("length,stride", [(1, 1), (4, 3), (11, 1)])
def test_trajectory_windows_match_reference(trajectories, length, stride):
    states, actions = trajectories
    ds = ls.trajectory_windows(states, actions, length=length, stride=stride, split="all")
    reference = [
        (states[n, s : s + length + 1], actions[n, s : s + length])
        for n in range(10)
        for s in range(0, 12 - length, stride)
    ]
    assert len(ds) == len(reference)
    for i, (x, u) in enumerate(reference):
        np.testing.assert_array_equal(ds[i]["states"], x)
        np.testing.assert_array_equal(ds[i]["actions"], u)
    # Actions of length T_total - 1 work too; without actions there is no "actions" key.
    short = ls.trajectory_windows(states, actions[:, :-1], length=length, split="all")
    np.testing.assert_array_equal(short[0]["actions"], actions[0, :length])
    assert set(ls.trajectory_windows(jnp.asarray(states), length=length)[0]) == {"states"}


def test_trajectory_split_by_trajectory(trajectories):
    states, _ = trajectories
    seen = {}
    for split in ("train", "valid", "test"):
        ds = ls.trajectory_windows(states, length=3, split=split, valid_fraction=0.2)
        seen[split] = {int(ds[i]["states"][0, 0]) for i in range(len(ds))}
    assert len(seen["valid"]) == 2 and len(seen["test"]) == 1 and len(seen["train"]) == 7
    assert set().union(*seen.values()) == set(range(10))
    assert not (seen["train"] & seen["valid"]) and not (seen["train"] & seen["test"])
    batch = next(iter(ls.trajectory_dataset(states, length=3, batch_size=4, split="valid", seed=0)))
    assert batch["states"].shape == (4, 4, 3)
    assert {int(v) for v in batch["states"][:, 0, 0]} <= seen["valid"]


def test_trajectory_bad_inputs(trajectories):
    states, actions = trajectories
    bad = states.copy()
    bad[3, 5, 1] = np.nan
    with pytest.raises(ValueError, match=r"states contains 1 non-finite .* index \(3, 5, 1\)"):
        ls.trajectory_windows(bad, length=2)
    bad_u = actions.copy()
    bad_u[0, 0, 0] = np.inf
    with pytest.raises(ValueError, match="actions contains 1 non-finite"):
        ls.trajectory_windows(states, bad_u, length=2)
    with pytest.raises(ValueError, match=r"length must be in \[1, T_total - 1\] = \[1, 11\]"):
        ls.trajectory_windows(states, length=12)
    with pytest.raises(ValueError, match="actions must have T_total=12"):
        ls.trajectory_windows(states, actions[:, :5], length=2)
    with pytest.raises(ValueError, match="split='valid' has no trajectories"):
        ls.trajectory_windows(states, length=2, split="valid", valid_fraction=0.0)
    with pytest.raises(ValueError, match="split must be one of"):
        ls.trajectory_windows(states, length=2, split="eval")
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got batch_size=0"):
        ls.trajectory_dataset(states, length=2, batch_size=0)
    with pytest.raises(Exception, match="states"):  # jaxtyping: wrong rank names the argument
        ls.trajectory_windows(states[0], length=2)
    with pytest.raises(Exception, match="actions"):  # N mismatch between states and actions
        ls.trajectory_windows(states, actions[:3], length=2)


def test_trajectory_arrays_checked_without_jaxtyping(trajectories, no_jaxtyping):
    """The arrays are checked by the library too, not only by the hints (which
    `JAXTYPING_DISABLE=1` turns off): fewer actions than trajectories failed at the last
    windows, more were paired by index, 2-d actions and integer states passed."""
    states, actions = trajectories
    windows = inspect.unwrap(ls.trajectory_windows)  # as without jaxtyping's import hook
    for bad in (actions[:5], np.concatenate([actions, actions[:2]])):
        with pytest.raises(ValueError, match=r"actions must hold one row per trajectory .*\(10\)"):
            windows(states, bad, length=2)
    with pytest.raises(ValueError, match=r"actions must be a floating array of shape \(num, "):
        windows(states, actions[..., 0], length=2)
    with pytest.raises(
        ValueError, match=r"states must be .* got shape \(10, 12, 3\) and dtype int"
    ):
        windows(states.astype(np.int64), length=2)
    assert windows(states.astype(jnp.bfloat16), length=2)[0]["states"].dtype == jnp.bfloat16
    with pytest.raises(
        ValueError, match=r"states must .* features at least 1, got shape \(10, 12, 0\)"
    ):
        windows(states[..., :0], length=2)
    with pytest.raises(ValueError, match=r"split='all' has no trajectories out of 0"):
        ls.split_trajectories(0, "all", valid_fraction=0.1, test_fraction=0.1)


def test_trajectory_integer_and_real_arguments(trajectories):
    states, _ = trajectories
    everything = ls.trajectory_windows(
        states, length=np.int64(3), valid_fraction=0, test_fraction=0
    )
    assert len(everything) == 10 * 9  # every trajectory: windows start at 0..8
    assert len(ls.split_trajectories(10, "train", valid_fraction=0, test_fraction=0)) == 10
    # The documented assignment: a default_rng(split_seed) permutation, valid first, then test.
    perm = np.random.default_rng(3).permutation(20)
    parts = {"valid": perm[:2], "test": perm[2:6], "train": perm[6:]}
    for name, want in parts.items():
        got = ls.split_trajectories(20, name, valid_fraction=0.1, test_fraction=0.2, split_seed=3)
        np.testing.assert_array_equal(got, np.sort(want), err_msg=name)
    with pytest.raises(ValueError, match="stride must be a positive integer, got stride=True"):
        ls.trajectory_windows(states, length=2, stride=True)
    split = inspect.unwrap(ls.split_trajectories)  # as without jaxtyping's import hook
    for bad in (5.5, -3, True):
        with pytest.raises(
            ValueError,
            match=f"num_trajectories must be an integer >= 0, got num_trajectories={bad}",
        ):
            split(bad, "train", valid_fraction=0.1, test_fraction=0.1)
    with pytest.raises(ValueError, match="split_seed must be an integer >= 0, got split_seed=-1"):
        split(10, "train", valid_fraction=0.1, test_fraction=0.1, split_seed=-1)


def test_trajectory_windows_are_copies(trajectories):
    """Neither later changes to the caller's arrays nor in-place edits of an example
    reach the dataset (nor, so, skip its finiteness check)."""
    states, actions = (x.copy() for x in trajectories)
    ds = ls.trajectory_windows(states, actions, length=3, split="all")
    first = ds[0]["states"].copy()
    states[:] = np.nan
    actions[:] = np.nan
    ds[0]["states"][:] = 0
    np.testing.assert_array_equal(ds[0]["states"], first)
    assert np.isfinite(ds[0]["actions"]).all()
