"""shmbuf.compat.imitation, called as imitation's users call buffer.Buffer / ReplayBuffer
(seed-semantics 1.1)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from shmbuf.compat.imitation import Buffer, ReplayBuffer, Transitions

import helpers


@pytest.fixture
def buf(name):
    b = Buffer(4, {"a": (2,), "k": ()}, {"a": np.float32, "k": np.int64}, name=name, seed=0)
    yield b
    b.close()


def rows(values):
    v = np.asarray(values)
    return {"a": np.stack([v, v], 1).astype(np.float32), "k": v}


def test_declared_keys_must_match(name):
    with pytest.raises(KeyError, match="keys don't match"):
        Buffer(4, {"a": ()}, {"b": np.int64}, name=name)


def test_store_checks_in_imitations_order_and_changes_nothing(buf):
    buf.store(rows([7]))
    cases = [({}, "Missing keys"), ({"a": np.zeros((1, 2))}, "Missing keys"),
             ({**rows([1]), "x": np.zeros(1)}, "Unexpected keys"),
             ({"a": np.zeros((2, 2)), "k": np.zeros(3)}, "different length"),
             ({"a": np.zeros((0, 2)), "k": np.zeros(0)}, "empty data"),
             (rows(range(5)), "Not enough capacity"),
             ({"a": np.zeros((2, 3)), "k": np.zeros(2)}, "Wrong data shape for a"),
             ({"a": np.zeros((9, 3)), "k": np.zeros(9)}, "Not enough capacity")]
    for data, why in cases:
        with pytest.raises(ValueError, match=why):
            buf.store(data)
    with pytest.raises(ValueError, match="Wrong data shape"):  # checked after truncation
        buf.store({"a": np.zeros((9, 3)), "k": np.zeros(9)}, truncate_ok=True)
    assert buf.size() == 1 and set(buf.sample(50)["k"].tolist()) == {7}


def test_fifo_wrap_and_truncation_as_verified(buf):
    buf.store(rows([0, 1, 2]))
    buf.store(rows([3, 4, 5]))
    assert buf.size() == 4 and set(buf.sample(400)["k"].tolist()) == {2, 3, 4, 5}
    buf.store(rows(range(100, 110)), truncate_ok=True)  # the last capacity rows
    assert set(buf.sample(400)["k"].tolist()) == {106, 107, 108, 109}


def test_values_are_copied_and_cast_into_the_field(buf):
    data = rows([1, 2])
    buf.store(data)
    data["k"][:] = 99
    assert set(buf.sample(100)["k"].tolist()) == {1, 2}
    buf.store({"a": np.zeros((1, 2), np.float64), "k": np.array([1.9])})  # imitation casts: 1
    assert 1 in buf.sample(200)["k"].tolist() and buf.sample(1)["k"].dtype == np.int64
    for bad in (np.array([np.nan]), np.array([1e30])):
        with pytest.raises(ValueError, match="'k'"):
            buf.store({"a": np.zeros((1, 2)), "k": bad})
    assert buf.size() == 3


def test_sample(buf):
    with pytest.raises(ValueError, match="Buffer is empty"):
        buf.sample(1)
    buf.store(rows([3, 4]))
    empty = buf.sample(0)
    assert empty["a"].shape == (0, 2) and empty["k"].shape == (0,)
    many = buf.sample(50)  # more than stored: with replacement
    assert many["a"].shape == (50, 2) and many["a"].dtype == np.float32
    assert (many["a"][:, 0] == many["k"]).all()  # rows aligned across keys


def test_from_data(name):
    with pytest.raises(ValueError, match="No keys"):
        Buffer.from_data({})
    with pytest.raises(ValueError, match="different length"):
        Buffer.from_data({"a": np.zeros(3), "b": np.zeros(4)})
    data = {"x": np.arange(5, dtype=np.int16), "y": np.ones((5, 3))}
    with Buffer.from_data(data, name=name) as b:
        assert b.capacity == 5 and b.size() == 5 and b.sample(2)["x"].dtype == np.int16
        assert b.sample_shapes == {"x": (), "y": (3,)}
    with pytest.raises(ValueError, match="Not enough capacity"):
        Buffer.from_data(data, 3, name=name)
    with Buffer.from_data(data, 3, truncate_ok=True, name=name) as b:
        assert set(b.sample(100)["x"].tolist()) == {2, 3, 4}
    with pytest.raises(ValueError, match="capacity"):
        Buffer(0, {"a": ()}, {"a": np.int64})  # (imitation accepts 0; shmbuf says why not)


def transitions(k, obs_dtype=np.float32):
    k = np.asarray(k)
    infos = np.empty(len(k), object)
    infos[:] = [{"i": int(i)} for i in k]
    return Transitions(obs=np.stack([k, k], 1).astype(obs_dtype), acts=k, infos=infos,
                       next_obs=np.stack([k + 1, k + 1], 1).astype(obs_dtype), dones=k % 2 == 0)


def test_replay_buffer_schema_from_explicit_fields_or_an_env(name):
    with pytest.raises(ValueError, match="Shape or dtype missing"):
        ReplayBuffer(4, obs_shape=(2,), act_shape=())
    space = SimpleNamespace(shape=(2,), dtype=np.dtype(np.float32))
    venv = SimpleNamespace(observation_space=space, action_space=SimpleNamespace(shape=(), dtype=np.dtype(np.int64)))
    with pytest.raises(ValueError, match="Cannot specify both"):
        ReplayBuffer(4, venv, obs_shape=(2,))
    with ReplayBuffer(8, venv, name=name) as rb:
        rb.store(transitions(range(3)))
        t = rb.sample(5)
        assert type(t).__name__ == "Transitions" and len(t) == 5  # (imitation's, where installed)
        assert t.obs.dtype == np.float32 and t.acts.dtype == np.int64 and t.dones.dtype == bool
        assert (t.next_obs == t.obs + 1).all() and (t.dones == (t.acts % 2 == 0)).all()
        assert t.infos.dtype == object and all(info == {"i": a} for info, a in zip(t.infos, t.acts))  # each row's


def same(a, b) -> bool:
    """``a`` and ``b`` equal, of the same types all the way down (numpy dtypes and
    shapes, -0.0 and NaN included): what a buffer that keeps the objects returns."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return all(same(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
        return a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, (float, complex)):
        return repr(a) == repr(b)
    return a == b


def odd_infos():
    """One of each kind an infos holds, nested; a 100 KB array; many keys; empty."""
    return [{"a": np.float32(1.5), "s": "step3 é\ud800", "done": True, "v": np.arange(3), "none": None,
             "episode": {"r": 1.5, "l": 10, "t": -0.0, "nan": float("nan")}, "list": [1, "x", None, [2.5, (3,)]],
             "tuple": (np.int8(-1), b"\x00bytes", 1 + 2j), "big_int": 2 ** 100, "neg": -(2 ** 70),
             "zero_d": np.array(7.0), "strs": np.array(["ab", "c"]), "bytes_arr": np.array([b"x", b"yz"]),
             "when": np.datetime64("2026-11-29T12:00", "s"), "span": np.array([1, 2], "timedelta64[ms]"),
             "big_endian": np.arange(4, dtype=">i4").reshape(2, 2), "empty": np.zeros((0, 3)), "nested": {},
             "objects": np.array([{"k": 1}, None, "s"], dtype=object), 3: "int key", (1, "t"): "tuple key",
             None: "None key", 2.5: "float key", False: "bool key"},
            {"terminal_observation": np.random.default_rng(0).random(12_800)},  # 100 KB
            {f"key{i}": i * 0.5 for i in range(2000)},
            {}, {"deep": {"a": {"b": {"c": {"d": [np.eye(2)]}}}}}, {"TimeLimit.truncated": False}]


def _store(rb, infos):
    n = len(infos)
    arr = np.empty(n, object)
    arr[:] = infos
    rb.store(Transitions(obs=np.arange(n, dtype=np.float32)[:, None], acts=np.arange(n), infos=arr,
                         next_obs=np.arange(1, n + 1, dtype=np.float32)[:, None], dones=np.zeros(n, bool)))


def test_infos_of_any_size_and_kind_come_back_equal_with_their_types(name):
    """Each transition's infos comes back with its row, equal to what was stored, types
    and dtypes included (imitation returns the objects themselves): 100 KB arrays, 2,000
    keys, nesting, None, lists, tuples, big ints, keys that are not strings, empty ones;
    from another handle, through sample (seeded and numpy's global generator) and
    _arrays. Before: a row kept at most info_bytes=256 bytes and left the rest out."""
    infos = odd_infos()
    rb = ReplayBuffer(16, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64,
                      name=name, seed=0)
    _store(rb, infos)
    other = ReplayBuffer.attach(name)
    seen = set()
    for s in (other.sample(200), rb.sample(200)):
        for act, info in zip(s.acts.tolist(), s.infos):
            assert same(info, infos[act]), act
            seen.add(act)
    global_ = ReplayBuffer.attach(name, seed=None)
    np.random.seed(1)
    s = global_.sample(100)
    assert all(same(info, infos[act]) for act, info in zip(s.acts.tolist(), s.infos))
    assert seen == set(range(len(infos)))
    kept = rb._buffer._arrays["infos"]
    assert kept.dtype == object and all(same(kept[i], infos[i]) for i in range(len(infos)))
    assert [d for d in kept[len(infos):]] == [{}] * (16 - len(infos))  # (slots never written)
    for info in s.infos:  # a sample's dicts are its own copies: changing them changes nothing stored
        info.clear()
    s = rb.sample(100)
    assert all(same(info, infos[act]) for act, info in zip(s.acts.tolist(), s.infos))
    global_.close(); other.close(); rb.close()


def test_a_save_keeps_the_infos_with_their_rows(name, tmp_path):
    """core.save() of a ReplayBuffer with infos, loaded back and attached: every row's
    infos equal to what was stored (the infos are a ragged field: save format 4)."""
    import shmbuf

    infos = odd_infos()
    rb = ReplayBuffer(16, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64,
                      name=name, seed=0)
    _store(rb, infos)
    rb.core.save(tmp_path / "save")
    rb.close()
    with shmbuf.Buffer.load(tmp_path / "save", name=name + "-loaded") as loaded:
        again = ReplayBuffer.attach(loaded.name, seed=0)
        s = again.sample(200)
        assert set(s.acts.tolist()) == set(range(len(infos)))
        assert all(same(info, infos[act]) for act, info in zip(s.acts.tolist(), s.infos))
        again.close()


def test_what_only_pickle_could_keep_is_left_out_with_a_warning(name):
    """An object of another class (a function, an object(), a set) is left out with its
    key, with one warning per handle that names the keys; everything else of that infos
    is kept. info_bytes=0 keeps none; a bad info_bytes is refused."""
    rb = ReplayBuffer(8, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name, seed=0)
    infos = [{"keep": 1, "fn": len, "obj": object(), "n": {"set": {1}, "ok": [1]}, "l": [1, object()]}] * 2
    with pytest.warns(UserWarning, match=r"infos keys \['fn', 'l', 'n/set', 'obj'\] were left out.*only pickle"):
        _store(rb, infos)
    assert list(rb._buffer._arrays["infos"][:2]) == [{"keep": 1, "n": {"ok": [1]}}] * 2
    with pytest.raises(ValueError, match="info_bytes must be an int >= 0"):
        ReplayBuffer(4, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, info_bytes=-1)
    rb.store(SimpleNamespace(obs=np.zeros((3, 1), np.float32), acts=np.arange(3), dones=np.zeros(3, bool),
                             next_obs=np.zeros((3, 1), np.float32)))  # (no infos: an empty dict each)
    assert list(rb._buffer._arrays["infos"][2:5]) == [{}] * 3
    bare = ReplayBuffer(4, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, info_bytes=0)
    _store(bare, odd_infos()[:3])
    assert all(i == {} for i in bare.sample(10).infos) and "infos" not in bare._buffer._arrays
    bare.close(); rb.close()


def test_an_infos_larger_than_the_arena_is_refused_and_nothing_is_stored(name):
    """The infos lie in an arena of capacity x info_bytes bytes (at least 1 MiB): one
    transition's infos larger than it is a ValueError that says so, and nothing of that
    store is written (the rows before it included)."""
    rb = ReplayBuffer(4, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name, seed=0)
    _store(rb, [{"a": 1}])
    with pytest.raises(ValueError, match=r"the infos of transition 1 take 2,097,\d{3} bytes, more than the replay "
                                         r"buffer's arena holds \(1,048,576 bytes\); nothing was stored.*info_bytes="):
        _store(rb, [{"b": 2}, {"huge": np.zeros(1 << 18)}])
    assert rb.size() == 1 and list(rb._buffer._arrays["infos"][:2]) == [{"a": 1}, {}]
    big = ReplayBuffer(4, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, info_bytes=1 << 20)
    _store(big, [{"b": 2}, {"huge": np.zeros(1 << 18)}])  # 4 MiB: it fits
    assert big.size() == 2 and big._buffer._arrays["infos"][1]["huge"].shape == (1 << 18,)
    big.close(); rb.close()


def test_a_store_whose_infos_pass_the_arena_keeps_the_newest_rows_that_fit(name):
    """A store of rows whose infos take more than the arena, each of them less: written
    in parts that fit it, so its newest rows are kept, the oldest leave as a run of
    stores would leave them (size() below capacity), each row still with its own infos."""
    rb = ReplayBuffer(16, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name, seed=0)
    infos = [{"i": i, "pad": np.full(300_000 // 8, i, np.int64)} for i in range(8)]  # 8 x 300 kB into 1 MiB
    _store(rb, infos)
    assert 0 < rb.size() < 8
    drawn = ReplayBuffer.attach(name)  # (numpy's global generator, imitation's draw: over the rows still there)
    np.random.seed(0)
    for s in (rb.sample(100), drawn.sample(100)):
        assert set(s.acts.tolist()) == set(range(8 - rb.size(), 8))
        assert all(same(info, infos[a]) for a, info in zip(s.acts.tolist(), s.infos))
    drawn.close(); rb.close()


def test_a_segment_with_infos_in_fixed_rows_is_still_read_and_written(name):
    """A ReplayBuffer segment an older shmbuf made (its infos in info_bytes bytes of each
    row, shmbuf.compat.infos.encode) attaches, samples and stores as it did: its rows
    decode, values past its rows' bytes are left out with the warning of then."""
    from shmbuf.buffer.handle import Buffer as Core
    from shmbuf.compat.imitation import KIND_REPLAY
    from shmbuf.compat.infos import encode

    fields = {"obs": ((1,), np.float32), "acts": ((), np.int64), "next_obs": ((1,), np.float32),
              "dones": ((), bool), "infos": ((64,), np.uint8)}
    old = Core.create(fields, 8, name=name, _library={"kind": KIND_REPLAY})
    row = np.zeros(64, np.uint8)
    assert encode({"a": np.float32(2.5), "s": "x"}, row) == []
    old.extend({"obs": np.zeros((1, 1), np.float32), "acts": np.array([5]), "next_obs": np.ones((1, 1), np.float32),
                "dones": np.zeros(1, bool), "infos": row[None]})
    rb = ReplayBuffer.attach(name, seed=0)
    got = rb.sample(4)
    assert got.acts.tolist() == [5] * 4 and all(same(i, {"a": np.float32(2.5), "s": np.str_("x")}) for i in got.infos)
    with pytest.warns(UserWarning, match=r"infos keys \['big'\] were left out.*info_bytes=64"):
        _store(rb, [{"k": 1, "big": np.zeros(100)}])
    assert list(rb._buffer._arrays["infos"][:3]) == [{"a": 2.5, "s": "x"}, {"k": 1}, {}]
    rb.close(); old.close()


def test_the_usual_infos_of_a_gail_run_fit_the_default_info_bytes(name):
    """A last step's infos under Monitor, TimeLimit and imitation's reward wrapper (what
    GAIL stores, CI's failure of 2026-11-29: with the row's 8-byte check a JSON header
    with spaces took 261 bytes, past the default 256) are kept whole, with no warning:
    headers are compact JSON (241 bytes here)."""
    import warnings

    from shmbuf.compat.infos import encode

    info = {"TimeLimit.truncated": False, "terminal_observation": np.zeros(4, np.float32),
            "episode": {"r": 1.0, "l": 10, "t": 0.5}, "original_env_rew": np.float32(1.0)}
    assert encode(info, np.zeros(256, np.uint8)) == [] and encode(info, np.zeros(240, np.uint8)) != []
    rb = ReplayBuffer(4, obs_shape=(4,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb.store(Transitions(obs=np.zeros((2, 4), np.float32), acts=np.zeros(2, np.int64),
                             infos=np.array([info, info], dtype=object),
                             next_obs=np.zeros((2, 4), np.float32), dones=np.ones(2, bool)))
    got = rb.sample(4).infos[0]
    assert got["episode"] == info["episode"] and got["original_env_rew"] == np.float32(1.0)
    assert got["terminal_observation"].tolist() == [0.0] * 4
    rb.close()


def _row(header: bytes, values: bytes = b"", width: int = 128) -> np.ndarray:
    """A row with this header and these values, its check right (written by a writer
    that has it wrong, not damaged on the way): what the header checks alone must catch."""
    from shmbuf.compat.infos import CHECK, checks

    row = np.zeros(width, np.uint8)
    blob = len(header).to_bytes(2, "little") + header + values
    row[:len(blob)] = np.frombuffer(blob, np.uint8)
    row[-CHECK:] = checks(row[None]).view(np.uint8)
    return row


BAD_HEADERS = {
    "key path a string": b'[["abc", "<f8", []]]',  # (was: the key path ('a', 'b', 'c'))
    "shape not an int": b'[[["x"], "<f8", [1.5]]]',  # (was: a shape of 1)
    "shape a bool": b'[[["x"], "<f8", [true]]]',
    "shape a string": b'[[["x"], "<f8", ["1"]]]',
    "shape infinite": b'[[["x"], "<f8", [Infinity]]]',  # (was: OverflowError)
    "shape past the row": b'[[["x"], "<f8", [1000000000000000000000000000000]]]',
    "shape negative": b'[[["x"], "<f8", [-1]]]',
    "dtype numpy cannot read": b'[[["x"], "<08", []]]',  # (was: SyntaxError, from numpy)
    "dtype of no size": b'[[["x"], "<f3", []]]',
    "dtype not canonical": b'[[["x"], "<b1", []]]',
    "dtype of objects": b'[[["x"], "|O8", []]]',
    "dtype of empty strings": b'[[["x"], "<U0", []]]',
    "dtype not a string": b'[[["x"], 8, []]]',
    "empty key path": b'[[[], "<f8", []]]',
    "entry of two": b'[[["x"], "<f8"]]',
    "not a list": b'{"x": 1}',
    "no entries": b'[]',
    "not JSON": b'[[["x"], "<f8", []]',
    "not UTF-8": b'[[["\xff"], "<f8", []]]',
}


@pytest.mark.parametrize("header", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_an_infos_header_is_read_strictly(header):
    """Trust round 4, item 3: a header that encode never writes is a ValueError that says
    the row is damaged, whatever its checksum; before, some decoded into something else
    and some raised SyntaxError or OverflowError."""
    from shmbuf.compat.infos import decode

    with pytest.raises(ValueError, match="infos row is damaged"):
        decode(_row(header, bytes(16)))


def test_an_infos_header_nested_too_deeply_is_a_value_error():
    from shmbuf.compat.infos import decode

    with pytest.raises(ValueError, match="infos row is damaged"):  # (was: RecursionError)
        decode(_row(b"[" * 20_000 + b"]" * 20_000, width=40_016))


def test_every_random_damage_of_an_infos_row_is_a_value_error():
    """Random bytes of valid rows changed (anywhere: length, header, values, check, the
    zeros after; random values, or characters that keep a header JSON): every row whose
    bytes that decoding reads changed (an empty dict's: any byte) is a ValueError saying
    it is damaged, never another exception, never another dict; any other row decodes
    as written."""
    from shmbuf.compat.infos import CHECK, _entries, decode, decode_rows, encode

    def same(a, b):
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    infos = [{"a": np.float32(1.5), "s": "step3", "done": True, "v": np.arange(3), "n": {"x": 2, "y": {"z": np.eye(2)}}},
             {"abc": 1}, {"k": np.array([1.5, -2.5]), "c": 1 + 2j, "u": np.uint8(7)}, {}]
    rng = np.random.default_rng(0)
    damaged = 0
    for t in range(4000):
        info = infos[t % len(infos)]
        row = np.zeros(256, np.uint8)
        assert encode(info, row) == []
        good = row.copy()
        header = 2 + (int(row[0]) | int(row[1]) << 8)
        read = len(row) if not info else \
            header + sum(e[3] for e in _entries(row[2:header].tobytes(), len(row))) + CHECK
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, header if rng.random() < 0.5 else len(row)))
            row[i] = ord(rng.choice(list('0123456789.-e,[]"{}aU<>|fiub '))) if rng.random() < 0.5 \
                else int(rng.integers(0, 256))
        if (row[:read] == good[:read]).all():
            assert same(decode(row), info)
            continue
        damaged += 1
        with pytest.raises(ValueError, match="infos row is damaged"):
            decode(row)
        with pytest.raises(ValueError, match="infos row is damaged"):  # (among whole rows too)
            decode_rows(np.stack([good, row, good]))
    assert damaged > 3500


def test_a_damaged_infos_row_is_a_value_error_never_a_crash():
    from shmbuf.compat.infos import decode, encode

    row = np.zeros(64, np.uint8)
    assert encode({"x": 1.0}, row) == []
    for damage in (lambda r: r.__setitem__(0, 250), lambda r: r.__setitem__(slice(3, 9), 0x7b),
                   lambda r: r.__setitem__(slice(2, 40), np.frombuffer(b'[[["x"], "|O", []]]'.ljust(38), np.uint8))):
        bad = row.copy()
        damage(bad)
        with pytest.raises(ValueError, match="infos row"):
            decode(bad)
    for header in (b'[[[1], "<f8", []]]', b'[[["a"], "<f8", []], [["a", "b"], "<f8", []]]',
                   b'[[["a"], "<f8", []], [["a"], "<f8", []]]'):  # a key not a str, both kinds, twice
        with pytest.raises(ValueError, match="infos row"):
            decode(_row(header, bytes(16)))
    odd = {"x'}); import os #": 2.0, "y": {"\"z": np.arange(2)}}  # keys are data, never code
    wide = np.zeros(256, np.uint8)
    assert encode(odd, wide) == []
    got = decode(wide)
    assert got["x'}); import os #"] == 2.0 and got["y"]["\"z"].tolist() == [0, 1]


def test_replay_buffer_store_defaults_to_truncating_and_drops_extra_fields(name):
    with ReplayBuffer(4, obs_shape=(2,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name) as rb:
        t = transitions(range(10))
        rb.store(SimpleNamespace(**{f: getattr(t, f) for f in ("obs", "acts", "infos", "next_obs", "dones")},
                                 rews=np.ones(10)))
        assert rb.size() == 4 and set(rb.sample(200).acts.tolist()) == {6, 7, 8, 9}
        with pytest.raises(ValueError, match="Not enough capacity"):
            rb.store(t, truncate_ok=False)


def test_transitions_are_checked():
    t = transitions(range(3))
    with pytest.raises(ValueError, match="same number"):
        Transitions(obs=t.obs, acts=t.acts[:2], infos=t.infos, next_obs=t.next_obs, dones=t.dones)
    with pytest.raises(ValueError, match="same shape"):
        Transitions(obs=t.obs, acts=t.acts, infos=t.infos, next_obs=t.next_obs[:, :1], dones=t.dones)
    with pytest.raises(ValueError, match="boolean"):
        Transitions(obs=t.obs, acts=t.acts, infos=t.infos, next_obs=t.next_obs, dones=t.dones.astype(int))


def test_replay_buffer_from_data(name):
    with ReplayBuffer.from_data(transitions(range(6), np.int32), name=name) as rb:
        assert rb.capacity == 6 and rb.size() == 6 and rb.sample(3).obs.dtype == np.int32
    with pytest.raises(ValueError, match="Not enough capacity"):
        ReplayBuffer.from_data(transitions(range(6)), 4, name=name)
    with ReplayBuffer.from_data(transitions(range(6)), 4, truncate_ok=True, name=name) as rb:
        assert set(rb.sample(100).acts.tolist()) == {2, 3, 4, 5}


@pytest.mark.timeout(120)
def test_another_process_stores_by_name_while_this_one_samples(name):
    with ReplayBuffer(64, obs_shape=(2,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name) as rb:
        again = pickle.loads(pickle.dumps(rb))  # pickles as its name
        assert again.name == name and again.capacity == 64
        again.close()
        with pytest.raises(ValueError, match="not an imitation Buffer"):
            Buffer.attach(name)

        def check():
            if not rb.size():
                return 0
            t = rb.sample(32)  # every sampled triple is whole
            assert (t.obs[:, 0] == t.acts).all() and (t.next_obs[:, 0] == t.acts + 1).all()
            assert (t.dones == (t.acts % 5 == 0)).all()
            return 32
        size, checked = helpers.check_while_child_writes(helpers.imitation_storer, (name, 200), check)
        assert size == 64 and rb.size() == 64 and checked > 0


def test_conflicting_arguments_get_imitations_message_each():
    from shmbuf.compat.imitation import ReplayBuffer as RB

    class Space:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

    class Venv:
        observation_space, action_space = Space((3,), np.float32), Space((1,), np.int64)

    cases = [({"obs_shape": (3,)}, "observation shape"), ({"obs_dtype": np.float32}, "observation dtype"),
             ({"act_shape": (1,)}, "action shape"), ({"act_dtype": np.int64}, "action dtype")]
    for kwargs, what in cases:
        with pytest.raises(ValueError, match=f"Cannot specify both {what} and also environment with an "):
            RB(10, Venv(), **kwargs)
    with pytest.raises(ValueError, match="Shape or dtype missing and no environment specified."):
        RB(10, obs_shape=(3,))


def test_without_seed_it_draws_from_numpys_global_generator_as_imitation_does(name):
    from shmbuf.compat.imitation import Buffer as B

    data = {"a": np.arange(10)[:, None] * np.ones((1, 2), np.int64)}
    with B(6, {"a": (2,)}, {"a": np.int64}, name=name) as buf, \
            B(6, {"a": (2,)}, {"a": np.int64}, name=name + "s", seed=3) as own:
        buf.store(data, truncate_ok=True)
        own.store(data, truncate_ok=True)
        np.random.seed(0)
        first = buf.sample(50)["a"][:, 0]
        np.random.seed(0)
        again = buf.sample(50)["a"][:, 0]
        np.random.seed(0)
        slots = np.random.randint(6, size=50)  # imitation's draw: its slots hold rows 4 .. 9
        assert first.tolist() == again.tolist() == np.arange(4, 10)[slots].tolist()
        try:
            from imitation.data.buffer import Buffer as Theirs
        except ImportError:
            pass
        else:  # imitation's own buffer, fed and seeded alike, draws the same rows
            theirs = Theirs(6, {"a": (2,)}, {"a": np.int64})
            theirs.store(data, truncate_ok=True)
            np.random.seed(0)
            assert theirs.sample(50)["a"][:, 0].tolist() == first.tolist()
        np.random.seed(0)
        state = np.random.get_state()[1].copy()
        own.sample(50)  # a seeded buffer leaves the global generator alone
        assert (np.random.get_state()[1] == state).all()
        buf.unlink(), own.unlink()


def test_imitations_private_attributes_are_read_only_views_of_the_rows(name):
    """_idx, _n_data and _arrays as imitation's (its tests and users read them): views of
    the shared memory that show another handle's rows and refuse writes."""
    buf = Buffer(4, {"a": (2,)}, {"a": np.int32}, name=name)
    other = Buffer.attach(name)
    other.store({"a": np.arange(6).reshape(3, 2)})
    assert (buf._idx, buf._n_data) == (3, 3)
    assert buf._arrays["a"].tolist() == [[0, 1], [2, 3], [4, 5], [0, 0]]
    other.store({"a": np.arange(6).reshape(3, 2) + 10})  # wraps: imitation's ring order
    assert buf._idx == 2 and buf._arrays["a"].tolist() == [[12, 13], [14, 15], [4, 5], [10, 11]]
    with pytest.raises(ValueError, match="read-only"):
        buf._arrays["a"][0] = 7
    rb = ReplayBuffer(3, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64)
    assert rb._buffer._idx == 0 and set(rb._buffer._arrays) == {"obs", "acts", "next_obs", "dones", "infos"}
    rb.close(); other.close(); buf.close()


def _record(header: bytes, values: bytes = b"") -> bytes:
    """A record with this header and these values, its check right (a writer that has it
    wrong, not damage on the way): what the header checks alone must catch."""
    from shmbuf.compat.records import HEAD, checks

    body = len(header).to_bytes(HEAD, "little") + header + values
    return body + checks(np.frombuffer(body, np.uint8)[None]).astype("<u8").tobytes()


BAD_RECORD_HEADERS = {
    "tag unknown": (b'["q", 1]', 8),
    "scalar unknown": (b'"X"', 8),
    "dict key without value": (b'["d", "a"]', 0),
    "dict key twice": (b'["d", "a", "F", "a", "F"]', 16),
    "dict NaN key twice": (b'["d", ["f", NaN], "F", ["f", NaN], "F"]', 16),
    "key of a list": (b'["d", ["l"], "F"]', 8),
    "key int as bool": (b'["d", ["i", true], "F"]', 8),
    "array dtype of objects": (b'["a", "|O8", []]', 8),
    "array dtype not canonical": (b'["a", "<b1", []]', 1),
    "array dtype numpy cannot read": (b'["a", "<08", []]', 8),
    "array dtype of no size": (b'["a", "<U0", []]', 0),
    "array shape a float": (b'["a", "<f8", [1.5]]', 8),
    "array shape negative": (b'["a", "<f8", [-1]]', 8),
    "array shape past the record": (b'["a", "<f8", [1000000000000]]', 8),
    "array without shape": (b'["a", "<f8"]', 8),
    "string length negative": (b'["s", -1]', 0),
    "string length a bool": (b'["s", true]', 1),
    "values fewer than named": (b'["a", "<f8", [2]]', 8),
    "values more than named": (b'"F"', 16),
    "big int not hex": (b'["L", "12"]', 0),
    "object array of other count": (b'["o", [2], "F"]', 8),
    "nested too deeply": (b'["l", ' * 40 + b'null' + b']' * 40, 0),
    "not JSON": (b'["d", "a"', 0),
    "not UTF-8": (b'["s", \xff]', 0),
    "header past the record": (None, 0),
}


@pytest.mark.parametrize("case", BAD_RECORD_HEADERS.values(), ids=BAD_RECORD_HEADERS.keys())
def test_an_infos_record_header_is_read_strictly(case):
    """A record header that pack never writes is a ValueError that says the record is
    damaged, whatever its check: never another value, never another exception."""
    from shmbuf.compat.records import CHECK, HEAD, checks, unpack

    header, size = case
    if header is None:  # (a length past the record's end)
        body = (1000).to_bytes(HEAD, "little") + b'"F"' + bytes(8)
        record = body + checks(np.frombuffer(body, np.uint8)[None]).astype("<u8").tobytes()
    else:
        record = _record(header, bytes(size))
    with pytest.raises(ValueError, match="infos row is damaged"):
        unpack(record)
    assert len(record) > HEAD + CHECK


def test_every_random_damage_of_an_infos_record_is_a_value_error():
    """Random bytes of packed records changed (anywhere: length, header, values, check;
    random values, or characters that keep a header JSON), records of 100 KB (past a
    64 kB block of the check) among them: every record changed is a ValueError saying
    it is damaged, alone or among good ones, never another exception or value."""
    from shmbuf.compat.records import HEAD, pack, unpack, unpack_rows

    infos = [i for i in odd_infos() if i] + [{"abc": 1}]
    records = [pack(i)[0] for i in infos]
    rng = np.random.default_rng(0)
    damaged = 0
    for t in range(1500):
        k = t % len(records)
        good = np.frombuffer(records[k], np.uint8)
        rec = good.copy()
        header = HEAD + int.from_bytes(records[k][:HEAD], "little")
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, header if rng.random() < 0.5 else len(rec)))
            rec[i] = ord(rng.choice(list('0123456789.-e,[]"{}aUdlstFIBC<>|fiub '))) if rng.random() < 0.5 \
                else int(rng.integers(0, 256))
        if (rec == good).all():
            assert same(unpack(rec), infos[k])
            continue
        damaged += 1
        with pytest.raises(ValueError, match="infos row is damaged"):
            unpack(rec)
        values = np.concatenate([good, rec, good])
        with pytest.raises(ValueError, match="infos row is damaged"):  # (among whole records too)
            unpack_rows(values, np.array([0, len(good), 2 * len(good), 3 * len(good)]))
    assert damaged > 1300


def test_the_check_of_a_row_past_64_kb_sees_any_word_and_is_unchanged_below():
    """checks() of a row of 64 kB or less is what it always was (the fixed rows of older
    segments still check); past 64 kB a change of any one word changes it (each block's
    words weighed by its own odd factor: blocks are not interchangeable)."""
    from shmbuf.compat.infos import _K, checks

    rng = np.random.default_rng(1)
    for m in (1, 7, 256, 65536):
        rows = rng.integers(0, 256, (3, m), dtype=np.uint8)
        padded = np.zeros((3, 4 * -(-m // 4)), np.uint8)
        padded[:, :m] = rows
        assert (checks(rows) == padded.view("<u4").astype(np.uint64) @ _K[:padded.shape[1] // 4]).all()
    row = rng.integers(0, 256, (1, 300_001), dtype=np.uint8)
    base = checks(row)
    for i in (0, 65536, 65539, 131072 + 5, 300_000):
        bad = row.copy()
        bad[0, i] ^= 0x80
        assert checks(bad) != base, i
    swapped = row.copy()  # the same word in two blocks: swapping the blocks changes the check
    swapped[0, :65536], swapped[0, 65536:131072] = row[0, 65536:131072], row[0, :65536]
    assert checks(swapped) != base


def test_record_keys_are_data_never_code():
    from shmbuf.compat.records import pack, unpack

    odd = {"x'}); import os #": 2.0, "y": {"\"z": np.arange(2)}, ("'", "]"): 1}
    got = unpack(pack(odd)[0])
    assert same(got, odd)


def test_the_same_infos_as_imitations_own_replay_buffer(name):
    """imitation's own ReplayBuffer (where imitation is installed: scripts/test-libraries),
    fed the same transitions and seeded alike, samples the same rows with infos equal to
    ours, types included (its are the stored objects themselves)."""
    theirs_module = pytest.importorskip("imitation.data.buffer")
    from imitation.data import types

    infos = odd_infos()
    n = len(infos)
    arr = np.empty(n, object)
    arr[:] = infos
    t = types.Transitions(obs=np.arange(n, dtype=np.float32)[:, None], acts=np.arange(n), infos=arr,
                          next_obs=np.arange(1, n + 1, dtype=np.float32)[:, None], dones=np.zeros(n, bool))
    ours = ReplayBuffer(8, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name)
    theirs = theirs_module.ReplayBuffer(8, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64)
    ours.store(t)
    theirs.store(t)
    np.random.seed(5)
    a = ours.sample(64)
    np.random.seed(5)
    b = theirs.sample(64)
    assert a.acts.tolist() == b.acts.tolist() and type(a) is type(b)
    assert all(same(x, y) for x, y in zip(a.infos, b.infos))
    ours.close()


def test_records_of_many_lengths_read_in_one_call_each_with_its_own_value():
    """unpack_rows over records of several lengths, empty ones and large ones among them
    (each way of reading a length's records: all end to end, picked out, and copied one
    by one past 4 M bytes), every record's value its own."""
    from shmbuf.compat.records import pack, unpack_rows
    from shmbuf.ragged.jagged import Jagged

    rng = np.random.default_rng(2)
    infos = [{"x": rng.random(12_800)} for _ in range(45)] + [{}, {"a": 1}, {"a": 2}, {"s": "é" * 3}, {}]
    order = rng.permutation(len(infos))
    infos = [infos[i] for i in order]
    j = Jagged.from_rows([np.frombuffer(pack(i)[0], np.uint8) for i in infos], dtype=np.uint8)
    got = unpack_rows(j.values, j.offsets)
    assert all(same(g, i) for g, i in zip(got, infos))
    same_length = [{"a": k} for k in range(5)]
    j = Jagged.from_rows([np.frombuffer(pack(i)[0], np.uint8) for i in same_length], dtype=np.uint8)
    assert [g["a"] for g in unpack_rows(j.values, j.offsets)] == list(range(5))


@pytest.mark.parametrize("broken", [False, True])
def test_a_record_covered_while_numpys_generator_samples_is_drawn_again(name, monkeypatch, broken):
    """A sample drawn from numpy's global generator (imitation's way) whose records
    another handle covers after their rows' checked gather, before their bytes are
    copied (arena.HOOK at "reading"), draws those rows again, from the same generator:
    every infos returned is its own row's. With the arena's check off (FAULTS) the
    covered bytes come out as the old rows' infos (the test's assertion would fail)."""
    from shmbuf.core import arena

    def t(acts, infos):
        n = len(acts)
        arr = np.empty(n, object)
        arr[:] = infos
        return Transitions(obs=np.asarray(acts, np.float32)[:, None], acts=np.asarray(acts), infos=arr,
                           next_obs=np.asarray(acts, np.float32)[:, None], dones=np.zeros(n, bool))

    def info(k):
        return {"i": k, "pad": np.full(40_000, k, np.int64)}  # 320 kB: 3 of them fit 1 MiB

    rb = ReplayBuffer(64, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, name=name)
    rb.store(t([0, 1, 2], [info(k) for k in range(3)]))
    writer = ReplayBuffer.attach(name, seed=0)
    calls = []

    def cover(point):
        if point == "reading" and not calls:
            calls.append(point)
            writer.store(t([100, 101, 102], [info(k) for k in (100, 101, 102)]))  # at 0: covers 0, 1, 2
    monkeypatch.setattr(arena, "HOOK", cover)
    if broken:
        monkeypatch.setattr(arena, "FAULTS", 1)
    np.random.seed(0)
    s = rb.sample(16)
    monkeypatch.setattr(arena, "HOOK", None)
    assert calls
    own = [i["i"] == a and (i["pad"] == a).all() for a, i in zip(s.acts.tolist(), s.infos)]
    if broken:
        assert set(s.acts.tolist()) <= {0, 1, 2} and not any(own)  # rows 0-2 with 100-102's infos
    else:
        assert set(s.acts.tolist()) <= {100, 101, 102} and all(own)
    writer.close(); rb.close()
