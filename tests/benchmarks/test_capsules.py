import json

from benchmarks.capsules import main


def test_tiny_bench_writes_json_and_docs_section(tmp_path):
    out, docs = tmp_path / "b.json", tmp_path / "BENCH.md"
    docs.write_text("# Benchmarks\n\nintro stays\n")
    args = ["--sizes_kib", "4", "64", "--buffers", "4", "8", "--rounds", "3", "--disk_rounds", "1",
            "--docs", str(docs), "--json", str(out)]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert [s["size_bytes"] for s in data["sizes"]] == [4096, 65536]
    for s in data["sizes"]:
        assert s["restore_us"]["median"] > 0 and s["copy_us"]["median"] > 0
        assert s["restore_over_copy"] > 0 and s["save_mb_s"] > 0 and s["load_mb_s"] > 0
    assert "restore 4 KiB under 50 us" in " ".join(data["targets"])
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nintro stays") and text.count("<!-- bench_capsules:begin -->") == 1
    assert "| 4 KiB | 4 | 3 |" in text and "- restore 64 MiB within 1.5x contiguous copy: not measured" in text
    assert main(args) == 0  # a second run replaces the section instead of appending
    assert docs.read_text().count("<!-- bench_capsules:begin -->") == 1
