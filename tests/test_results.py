"""The result records (swiftkv/results.py): every committed JSON result under docs/, and every one that left
the tree (docs/artifacts.json, restored from history), reads into its dataclass and writes back as the same
dict, key order included (so the files stay byte-identical), and the reports, tables and cards rendered from
them are the ones the dict-reading code rendered (tests/data/results/, written by the readers before they
read attributes: at 878fe58, and the profile and decode-steps tables at 858299d). The cards read records
and students' weights that left the tree: from a copy of docs/distill-study with those restored
(`restored_study`, tests/restored.py)."""

from __future__ import annotations

import copy
import importlib.util
import json
import lzma
from pathlib import Path

import pytest

from tests.restored import ENTRIES, restored, study_script

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("data") / "results"
DOCS = ROOT / "docs"


def schema_of(path: Path):
    from swiftkv.results import (
        BenchResults,
        DecodeStepsResults,
        DistillSummary,
        EvalResults,
        OnlineResults,
        ProfileResults,
    )

    name = path.name
    if name.endswith(("-eval.json", "-fulleval.json")):
        return EvalResults
    if name.endswith("-distill.json"):
        return DistillSummary
    return {
        "bench.json": BenchResults,
        "online.json": OnlineResults,
        "profile.json": ProfileResults,
        "decode-steps.json": DecodeStepsResults,
    }.get(name)


COMMITTED = sorted(p for p in DOCS.rglob("*.json") if schema_of(p) is not None)
# the results that left the tree (docs/artifacts.json), restored from history to be read
LEFT = sorted(path for path in ENTRIES if schema_of(Path(path)) is not None)


def test_every_kind_of_result_is_committed():
    kinds = {schema_of(p).__name__ for p in COMMITTED}
    assert kinds == {
        "EvalResults",
        "DistillSummary",
        "BenchResults",
        "OnlineResults",
        "ProfileResults",
        "DecodeStepsResults",
    }


def assert_round_trips(path: Path) -> None:
    data = json.loads(path.read_text())
    record = schema_of(path).from_json(data)
    assert record.to_json() == data
    assert json.dumps(record.to_json(), indent=2) == json.dumps(data, indent=2)  # key order too


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(DOCS)))
def test_committed_json_round_trips(path):
    assert_round_trips(path)


@pytest.mark.parametrize("path", LEFT, ids=lambda p: p.removeprefix("docs/"))
def test_a_result_that_left_the_tree_round_trips(path, tmp_path):
    assert_round_trips(restored([path], tmp_path)[0])


def test_records_are_read_by_attribute():
    from swiftkv.results import EvalResults, OnlineResults, Paired, TeacherForced

    data = json.loads((DOCS / "distill-study" / "r9-eval.json").read_text())
    results = EvalResults.from_json(data)
    student = results.students[0]
    assert isinstance(student.teacher_forced, TeacherForced)
    assert student.teacher_forced.kl_mean == data["students"][0]["teacher_forced"]["kl_mean"]
    assert student.pair.student == data["students"][0]["pair"]["student"]
    assert results.floor is None and student.long_prompt is None  # written as null / not written
    full = EvalResults.from_json(
        json.loads((DOCS / "distill-study" / "final64-n15-fulleval.json").read_text())
    )
    assert isinstance(full.students[0].tasks["arc_easy"].paired["acc"], Paired)
    online = OnlineResults.from_json(json.loads((DOCS / "bench" / "online" / "online.json").read_text()))
    assert online.results["baseline"][0].ttft_p99_s > 0 and online.idle["swiftkv"].ttft_s > 0
    assert online.summary.max_rate_ratio == 2.0


def test_a_record_keeps_what_its_schema_does_not_name_and_an_empty_one_is_falsy():
    from swiftkv.results import StudentResult, TeacherForced

    data = {"seconds": 1.5, "newer_measure": {"x": 1}, "pair": {"student": "s", "extra": True}}
    student = StudentResult.from_json(data)
    assert student.seconds == 1.5 and student.pair.student == "s" and student.tasks is None
    assert student.to_json() == data and list(student.to_json()) == list(data)
    assert not TeacherForced.from_json({}) and TeacherForced.from_json({"tokens": 0})
    assert StudentResult.of(student) is student
    with pytest.raises(AttributeError):
        student.seconds = 2.0  # frozen


# --------------------------------------------------------------------------------------------------
# Rendered from the committed results, as before
# --------------------------------------------------------------------------------------------------


def full_eval_results() -> dict:
    """A results dict with every section a report draws (tasks with metrics, the floor, long prompts,
    generation examples), built from committed results: finals-eval.json's students, final64-n15's
    paired task comparisons, teacher metrics made from them."""
    results = json.loads((DOCS / "distill-study" / "finals-eval.json").read_text())
    tasks = json.loads((DOCS / "distill-study" / "final64-n15-fulleval.json").read_text())["students"][0][
        "tasks"
    ]
    results["tasks"] = list(tasks)
    for student in results["students"]:
        student["tasks"] = {}
        for name, task in tasks.items():
            paired = task["paired"]["acc"]
            student["tasks"][name] = {
                "items": paired["n"],
                "limit": None,
                "metrics": {
                    "teacher": {"acc": paired["teacher"], "acc_stderr": 0.01},
                    "student": {"acc": paired["student"], "acc_stderr": 0.011},
                },
                "paired": copy.deepcopy(task["paired"]),
                "item_ids": [],
                "answers": {},
            }
        student["long_prompt"] = {
            "prompts": 4,
            "new_tokens": 16,
            "prompt_tokens_mean": 1500.4,
            "kl_mean": 0.25,
            "top1_agreement": 0.81,
            "identical_fraction": 0.5,
            "mean_first_divergence": 7.25,
        }
    floor = copy.deepcopy(results["students"][0])
    for key in ("tasks", "prefill_compute_saving"):
        floor.pop(key)
    floor["pair"] = {"student": "teacher at bfloat16", "teacher": results["teacher"], "mode": "separate"}
    results["floor"] = floor
    return results


def load_card(study: Path):
    """card.py of the checkout of `study` (a docs/distill-study with the files it reads that left the tree
    restored: the `restored_study` fixture), which reads them from there."""
    spec = importlib.util.spec_from_file_location("card", study_script(study, "card.py"))
    card = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(card)
    return card


def renderings(study: Path) -> dict[str, str]:
    """Name -> text, every reader on committed results (the names of the files in tests/data/results); the
    cards' from `study`."""
    from swiftkv.bench import offline, online_report, profile
    from swiftkv.evaluate import report, sweep

    finals = json.loads((study / "finals-eval.json").read_text())
    full = full_eval_results()
    out = {
        "finals-eval.report.md": report.markdown(finals),
        "full-eval.report.md": report.markdown(full),
        "finals-eval.sweep.md": sweep.tradeoff_table(finals),
        "full-eval.plot-data.txt": repr(
            [
                report.score_series(full),
                report.agreement_series(full),
                [sweep.quality(s) for s in full["students"]],
            ]
        ),
        "online.table.txt": online_report.format_table(
            json.loads((DOCS / "bench" / "online" / "online.json").read_text())
        ),
    }
    out["profile.table.txt"] = profile.format_table(
        json.loads((DOCS / "bench" / "profile" / "profile.json").read_text())
    )
    decode_steps = DOCS / "bench" / "online-spec" / "decode-steps" / "decode-steps.json"
    out["decode-steps.table.txt"] = profile.format_decode_steps(json.loads(decode_steps.read_text()))
    for name in ("auto", "bfloat16"):
        out[f"bench-{name}.table.txt"] = offline.format_table(
            json.loads((DOCS / "bench" / name / "bench.json").read_text())
        )
    card = load_card(study)
    # golden name -> round (its run and eval files' prefix), alias, N, time log, replies' count, note
    cards = {
        "card-swiftkv50.md": ("final64", "swiftkv50", 15, "12.5", 1000, "Shared CPU."),
        # a continued run's card: the run it continued comes first, read from its committed summary
        "card-swiftkv50-continued.md": ("cpu16m", "swiftkv50", 15, "", 15314, "Resumed."),
        # a chain of runs, each from the weights folder of the one before (--init-from), scored before install
        "card-swiftkv25-chain.md": ("cpu17m", "swiftkv25", 22, "", 32715, "Alone."),
    }
    for name, (round_name, alias, n, log, replies, note) in cards.items():
        out[name] = card.card(
            round_name,
            f"smollm2-135m-instruct-{alias}",
            n,
            json.loads((study / f"{round_name}-n{n}-distill.json").read_text()),
            json.loads((study / f"{round_name}-n{n}-fulleval.json").read_text()),
            log,
            "The capital of France is Paris.",
            replies,
            note,
        )
    # a soup's card: the mean of two students, each with its own README's "How it was made"
    out["card-swiftkv25-soup.md"] = card.soup_main(soup22_card_args(study))
    # a weighted soup with a GPU loan's snapshot as a student (its card: the loan's README)
    out["card-swiftkv50-soup.md"] = card.soup_main(soup15_card_args(study))
    # that soup trained on by one run from its folder (its card below the run's)
    out["card-swiftkv50-more.md"] = card.trained_soup_main(soup15more_card_args(study))
    # a soup stored at its parents' rank (soup.py --rank): that student and its own long-prompt last stage
    out["card-swiftkv50-long.md"] = card.soup_main(soup_long15_card_args(study))
    return out


def soup22_card_args(study: Path, *weights: str) -> list[str]:
    """card.py soup's arguments for the committed N = 22 soup and its two students (`weights`: each one's =WEIGHT)."""
    students = ("cpu17m-n22-student", "anneal22-n22-student")
    return [
        "smollm2-135m-instruct-swiftkv25",
        "22",
        str(study / "soup22-n22-student"),
        str(study / "heldout-soup22-a.json"),
        str(study / "soup22-n22-fulleval.json"),
        str(study / "cpu17m-n22-fulleval.json"),
        "previous tensors (cpu17m alone)",
        str(study / "soup22-paris.txt"),
        *(
            f"docs/distill-study/{name}={study / f'heldout-{name}.json'}" + (f"={w}" if w else "")
            for name, w in zip(students, weights or ("", ""), strict=True)
        ),
        *(
            "--paired",
            str(study / "soup22-gen128-eval.json"),
            "--paired",
            str(study / "soup22-long16-eval.json"),
        ),
    ]


def soup15_card_args(study: Path) -> list[str]:
    """card.py soup's arguments for the shipped N = 15 soup: cpu19m 3 : the H200 loan's N = 15 snapshot 1."""
    loan = "docs/distill-study/loan-h200-2026-11-27/n15"
    return [
        "smollm2-135m-instruct-swiftkv50",
        "15",
        str(study / "soup15-n15-student"),
        str(study / "heldout-soup15-w.json"),
        str(study / "soup15-n15-fulleval.json"),
        str(study / "cpu19m-n15-fulleval.json"),
        "previous tensors (cpu19m alone)",
        str(study / "soup15-paris.txt"),
        f"docs/distill-study/cpu19m-n15-student={study / 'heldout-cpu19m-n15-student.json'}=3",
        f"{loan}={study / 'heldout-loan-h200-2026-11-27-n15.json'}=1",
        *(
            "--paired",
            str(study / "soup15-gen128-eval.json"),
            "--paired",
            str(study / "soup15-long16-eval.json"),
        ),
    ]


def soup15more_card_args(study: Path) -> list[str]:
    """card.py more's arguments for the shipped N = 15 student: the N = 15 soup trained on by soup15more.sh."""
    return [
        "soup15more",
        "smollm2-135m-instruct-swiftkv50",
        "15",
        *(
            str(study / name)
            for name in (
                "soup15more-n15-distill.json",
                "heldout-soup15more-n15-student.json",
                "heldout-soup15-w.json",
                "soup15more-n15-fulleval.json",
                "soup15more-paris.txt",
                "replies-every-ids.jsonl.xz",
                "speed-soup15more.json",
                "soup15more-n15-bound.json",
            )
        ),
        *("--paired", str(study / "soup15more-gen128-eval.json")),
        *("--paired", str(study / "soup15more-long16-eval.json")),
    ]


def soup_long15_card_args(study: Path) -> list[str]:
    """card.py soup's arguments for the shipped N = 15 student: the equal mean, stored at rank 128, of soup15more
    (the -swiftkv50 before it) and soup15more's long-prompt last stage (long15.sh)."""
    return [
        "smollm2-135m-instruct-swiftkv50",
        "15",
        # the soup's own folder, its weights restored (they left the tree: docs/artifacts.json)
        str(study / "soup-long15-n15-student"),
        str(study / "heldout-soup-long15-r128.json"),
        str(study / "soup-long15-n15-fulleval.json"),
        str(study / "soup15more-n15-fulleval.json"),
        "previous tensors (soup15more)",
        str(study / "soup-long15-paris.txt"),
        *(
            f"docs/distill-study/{name}={study / f'heldout-{name}.json'}"
            for name in ("long15-n15-student", "soup15more-n15-student")
        ),
        *("--paired", str(study / "soup-long15-gen128-eval.json")),
        *("--paired", str(study / "soup-long15-long16-eval.json")),
    ]


# What the shipped students keep on unseen work: the long-prompt formats' run and the instructions' run
UNSEEN_RECORDS = (
    str(DOCS / "eval-full" / "2026-12-06-unseen-long" / "results.json"),
    str(DOCS / "eval-full" / "2026-12-07-instructions" / "results.json.xz"),
)


def mix15_card_args(study: Path) -> list[str]:
    """card.py more's arguments for the shipped N = 15 student: soup-long15 (the -swiftkv50 before it) trained on
    by the long-prompt QA study's mix run (scripts/study_long_qa.sh n15-mix), which recorded its own bound."""
    qa = study / "long-qa"
    return [
        "mix15",
        "smollm2-135m-instruct-swiftkv50",
        "15",
        str(qa / "n15-mix-distill.json"),
        str(qa / "heldout-n15-mix-student.json"),
        str(study / "heldout-soup-long15-r128.json"),
        str(qa / "eval-n15-mix-student.json.xz"),
        str(qa / "n15-mix-paris.txt"),
        f"{study / 'replies-every-ids.jsonl.xz'},{qa / 'replies-qa-mix-ids.jsonl.xz'}",
        "-",
        "-",
        *("--previous-qa", str(qa / "qa-shipped15-eval.json")),
        *("--unseen", *UNSEEN_RECORDS),
    ]


def mix22_card_args(study: Path) -> list[str]:
    """card.py more's arguments for the shipped N = 22 student: soup22 (the -swiftkv25 before it) trained on by
    the long-prompt QA study's mix run (scripts/study_long_qa.sh n22-mix), which recorded its own bound."""
    qa = study / "long-qa"
    return [
        "mix22",
        "smollm2-135m-instruct-swiftkv25",
        "22",
        str(qa / "n22-mix-distill.json"),
        str(qa / "heldout-n22-mix-student.json"),
        str(study / "heldout-soup22-a.json"),
        str(qa / "eval-n22-mix-student.json.xz"),
        str(qa / "n22-mix-paris.txt"),
        f"{study / 'replies-every-ids.jsonl.xz'},{qa / 'replies-qa-mix-ids.jsonl.xz'}",
        "-",
        "-",
        *("--previous-qa", str(qa / "qa-shipped22-eval.json")),
        *("--unseen", *UNSEEN_RECORDS),
    ]


def test_the_shipped_cards_are_the_rendered_ones(restored_study):
    """Each shipped model card is card.py's rendering of the records (committed, or restored where they left the
    tree): each that of a soup trained on by one run (the long-QA study's mix)."""
    weights = ROOT / "src" / "swiftkv" / "weights"
    card = load_card(restored_study)
    rendered = {
        "swiftkv25": card.trained_soup_main(mix22_card_args(restored_study)),
        "swiftkv50": card.trained_soup_main(mix15_card_args(restored_study)),
    }
    for alias, text in rendered.items():
        shipped = weights / f"smollm2-135m-instruct-{alias}" / "README.md"
        assert shipped.read_text() == text, alias


def test_a_trained_on_soups_card_holds_the_soups_own_making(restored_study):
    """The soup a shipped student went on from keeps, in its folder's README, the making its own shipped card
    gave; the trained-on card shows it one heading level down, below the run that went on from it."""
    card = load_card(restored_study)
    soup_card = card.soup_main(soup15_card_args(restored_study))
    folder_readme = (DOCS / "distill-study" / "soup15-n15-student" / "README.md").read_text()
    assert card.how_made(folder_readme) == card.how_made(soup_card)
    more = card.trained_soup_main(soup15more_card_args(restored_study))
    nested = "\n".join(card.how_made(soup_card))
    assert nested in more
    assert "#### The first student: `docs/distill-study/cpu19m-n15-student`" in more
    assert "--init-from docs/distill-study/soup15-n15-student" in more
    # soup15more, shipped until soup-long15, keeps its card's making the same way
    readme = (DOCS / "distill-study" / "soup15more-n15-student" / "README.md").read_text()
    assert card.how_made(readme) == card.how_made(more)
    # and the soups the long-QA study's mix runs went on from (each shipped until then), whose making the shipped
    # cards nest
    for folder, soup_args, shipped_args, alias in (
        ("soup-long15-n15-student", soup_long15_card_args, mix15_card_args, "swiftkv50"),
        ("soup22-n22-student", soup22_card_args, mix22_card_args, "swiftkv25"),
    ):
        readme = (DOCS / "distill-study" / folder / "README.md").read_text()
        soup_card = card.soup_main(soup_args(restored_study))
        assert card.how_made(readme) == card.how_made(soup_card), folder
        shipped = card.trained_soup_main(shipped_args(restored_study))
        assert "\n".join(card.how_made(soup_card)) in shipped
        assert f"--init-from smollm2-135m-instruct-{alias}" in shipped
        assert "--long-share 0.5 --long-kind passage-qa" in shipped


def test_a_soup_stored_at_a_lower_rank_says_so_and_how_much_it_left_out(restored_study):
    """A soup stored at its parents' rank (soup.py --rank) is not their exact mean: its card's command carries
    --rank, and it states the share of a mean change the stored factors leave out, measured on the folders."""
    text = load_card(restored_study).soup_main(soup_long15_card_args(restored_study))
    assert (
        "soup.py OUT docs/distill-study/long15-n15-student docs/distill-study/soup15more-n15-student --rank 128"
        in text
    )
    assert "`RANK=128 bash scripts/study/distill/soup.sh 15 OUT" in text
    assert "(at most 0.3% of its norm left out)" in text
    exact = load_card(restored_study).soup_main(soup22_card_args(restored_study))
    assert "--rank" not in exact and "left out" not in exact


def test_a_cards_bound_counts_the_runs_own_command(restored_study, tmp_path):
    """The card's fraction of the matmul bound takes the FLOPs per token of a summary of the run's own command
    (`--stop-after 0` by code that records them); one of another command is refused, naming the setting."""
    card = load_card(restored_study)
    args = soup15more_card_args(restored_study)
    counted = next(i for i, arg in enumerate(args) if arg.endswith("soup15more-n15-bound.json"))
    summary = json.loads(Path(args[counted]).read_text())
    summary["settings"]["lr"] *= 2
    args[counted] = str(tmp_path / "other.json")
    Path(args[counted]).write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="differs from the run's in lr"):
        card.trained_soup_main(args)


def test_a_paired_run_names_the_previous_tensors_as_the_repository_does(restored_study, tmp_path):
    """The paired runs recorded the previous tensors' path on the scoring machine; the card names that parent
    by its repository folder, so a checkout anywhere renders the same card; a run of another student is refused."""
    card = load_card(restored_study)
    args = soup22_card_args(restored_study)
    paired = [i + 1 for i, arg in enumerate(args) if arg == "--paired"]
    elsewhere = []
    for i in paired:
        run = json.loads(Path(args[i]).read_text())
        student = run["students"][0]["pair"]["student"]
        run["students"][0]["pair"]["student"] = "/somewhere/else/" + Path(student).name
        moved = tmp_path / Path(args[i]).name
        moved.write_text(json.dumps(run))
        elsewhere.append(str(moved))
    for i, path in zip(paired, elsewhere, strict=True):
        args[i] = path
    assert card.soup_main(args) == card.soup_main(soup22_card_args(restored_study))
    run = json.loads(Path(elsewhere[0]).read_text())
    run["students"][0]["pair"]["student"] = "/somewhere/else/another-student"
    Path(elsewhere[0]).write_text(json.dumps(run))
    with pytest.raises(ValueError, match="another-student is not one soup parent"):
        card.soup_main(args)


def test_a_weighted_soups_card_names_its_weights_and_shares(restored_study):
    """soup.py --weights: the card's command carries them and says how each delta_a was scaled."""
    text = load_card(restored_study).soup_main(soup22_card_args(restored_study, "3", "1"))
    command = "soup.py OUT docs/distill-study/cpu17m-n22-student docs/distill-study/anneal22-n22-student --weights 3,1"
    assert command in text
    script = "WEIGHTS=3,1 bash scripts/study/distill/soup.sh 22 OUT docs/distill-study/cpu17m-n22-student"
    assert script in text  # soup.sh takes the weights from its environment
    assert (
        "`delta_a` times its share, 0.75, 0.25: one bf16 rounding where a share is not a power of two" in text
    )
    assert "divided by 2" not in text


def test_reports_render_as_before(restored_study):
    rendered = renderings(restored_study)
    assert sorted(rendered) == sorted(p.name for p in GOLDEN.iterdir())
    for name, text in rendered.items():
        assert text == (GOLDEN / name).read_text(), name


def test_write_report_writes_results_json_as_given(tmp_path):
    """results.json written from the dict a run returns is that dict, byte for byte as json.dumps writes it."""
    from swiftkv.evaluate.report import write_report

    results = full_eval_results()
    paths = write_report(results, tmp_path)
    assert paths[0].read_text() == json.dumps(results, indent=2)
    assert paths[1].read_text() == (GOLDEN / "full-eval.report.md").read_text()
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_report_names_paths_in_their_portable_form(tmp_path, monkeypatch):
    """A report names the models a run was given by, a path as it reads on any machine: under the current folder
    relative to it, under the home folder as ~/... (results.json keeps what the run recorded)."""
    from swiftkv.evaluate.report import write_report

    home, here = tmp_path / "home", tmp_path / "home" / "swiftkv"
    monkeypatch.setenv("HOME", str(home))
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    results = full_eval_results()
    results["teacher"] = str(home / "models" / "teacher")
    results["students"][0]["pair"]["student"] = str(here / "runs" / "s1")
    results["floor"]["pair"]["student"] = f"{home / 'models' / 'teacher'} in bfloat16"
    paths = write_report(results, tmp_path / "out")
    report = paths[1].read_text()
    assert "Teacher: `~/models/teacher`" in report
    assert "- S1: `runs/s1 (N=" in report
    assert "| floor: ~/models/teacher in bfloat16 |" in report
    assert str(tmp_path) not in report
    assert json.loads(paths[0].read_text()) == results


def test_the_report_plots_what_the_run_measured():
    """An instruction-following run's plot holds its scores (each model's, the teacher's from the pairs) and
    agreement (the share of prompts with the teacher's verdict), not the empty panels of measures it did not
    run; a full suite's holds its tasks first."""
    from swiftkv.evaluate import report

    record = DOCS / "eval-full" / "2026-12-07-instructions" / "results.json.xz"
    results = json.loads(lzma.open(record, "rt").read())
    groups, series = report.score_series(results)
    assert groups == ["simple strict"]
    assert [label.split(":")[0] for label, _, _ in series] == ["teacher", "S1", "S2", "floor"]
    assert [round(values[0], 3) for _, values, _ in series] == [0.408, 0.227, 0.351, 0.406]
    assert series[0][2][0] == pytest.approx((0.408 * 0.592 / 490) ** 0.5, abs=1e-3)  # binomial s.e.
    groups, series = report.agreement_series(results)
    assert groups == ["simple same"] and series[0][1] == [
        1 - (119 + 30) / 490
    ]  # S1: 119 teacher-only, 30 own
    groups, _ = report.agreement_series(full_eval_results())
    assert groups[:2] == ["arc_easy", "arc_challenge"] and groups[-3:] == [
        "chat top-1",
        "gen identical",
        "long top-1",
    ]
