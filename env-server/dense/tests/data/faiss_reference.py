"""Reference files and answers from Python faiss-cpu for `tests/faiss_files.rs`.

    python faiss_reference.py write OUT_DIR
        Seeded random vectors and queries (raw little-endian f32 files), five indexes written by
        faiss.write_index (IndexFlatIP, IndexFlatL2, IndexIDMap over an IndexFlatIP, and fp16
        IndexScalarQuantizer by inner product and by L2) and faiss's own top-10 for every query
        of each, in OUT_DIR/answers.json.

    python faiss_reference.py search INDEX QUERIES K
        Read INDEX (e.g. one written by Grove) with faiss.read_index and print faiss's answers for
        the raw f32 QUERIES as JSON: {"d", "ntotal", "metric", "distances", "labels"}.
"""
import json
import sys

import faiss
import numpy as np


def write(out):
    rng = np.random.default_rng(20261205)
    d, n, nq = 48, 3000, 17
    xb = rng.standard_normal((n, d)).astype(np.float32)
    xq = rng.standard_normal((nq, d)).astype(np.float32)
    xb.tofile(f"{out}/vectors.f32")
    xq.tofile(f"{out}/queries.f32")
    answers = {"d": d, "n": n, "nq": nq, "k": 10, "faiss_version": faiss.__version__}
    ip = faiss.IndexFlatIP(d)
    ip.add(xb)
    l2 = faiss.IndexFlatL2(d)
    l2.add(xb)
    idmap = faiss.IndexIDMap(faiss.IndexFlatIP(d))
    ids = (1000 + 7 * np.arange(n)).astype(np.int64)
    idmap.add_with_ids(xb, ids)
    sq_ip = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    sq_ip.add(xb)
    sq_l2 = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_L2)
    sq_l2.add(xb)
    named = [("flat_ip", ip), ("flat_l2", l2), ("idmap_ip", idmap), ("sq_fp16_ip", sq_ip), ("sq_fp16_l2", sq_l2)]
    for name, index in named:
        faiss.write_index(index, f"{out}/{name}.index")
        dist, lab = index.search(xq, 10)
        answers[name] = {"distances": dist.tolist(), "labels": lab.tolist()}
    with open(f"{out}/answers.json", "w") as f:
        json.dump(answers, f)


def search(path, queries, k):
    index = faiss.read_index(path)
    xq = np.fromfile(queries, dtype="<f4").reshape(-1, index.d)
    dist, lab = index.search(xq, k)
    print(json.dumps({
        "d": index.d,
        "ntotal": index.ntotal,
        "metric": int(index.metric_type),
        "distances": dist.tolist(),
        "labels": lab.tolist(),
    }))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "search":
        search(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
