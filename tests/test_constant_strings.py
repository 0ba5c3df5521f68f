"""Constant strings and bytes in traced code: containment, methods and formatting fold
into the graph's Python side, compared with CPython."""
import torch

from differential import check

S = "hello world"


# -- constant strings and bytes --
def test_substring_containment_on_constant_strings():
    def f(x):
        s = "xaby"
        return x + 1, "ab" in s, "ab" not in s, "q" in s, "" in s, "xaby" in s, "xabyz" in s, \
            "lo" in S, S.__contains__("lo")
    check(f, [torch.ones(2)], graphs=1, breaks=0)


def test_bytes_containment_and_methods():
    def f(x):
        b = b"xaby"
        return x + 1, b"ab" in b, 97 in b, b"q" not in b, b.startswith(b"xa"), b.upper(), \
            b.decode(), b[1:3], b[0], b.split(b"a"), b.hex(), b.find(b"y"), len(b)
    check(f, [torch.ones(2)], graphs=1, breaks=0)


def test_string_methods_and_membership_in_tuples_of_strings():
    def f(x):
        n = "weight"
        return x + 1, n in ("weight", "bias"), "w" in ("weight",), n in ["bias"], \
            S.startswith(("he", "x")), S.split(), S.count("o"), S[1:4], f"{S!r:>20}|{n}", \
            "%s-%d" % (n, 3), "{:>5}".format(3), n.removesuffix("ght"), n.partition("i"), \
            str.upper(n), ",".join((n, S)), n.translate({101: None}), [c for c in "ab"]
    check(f, [torch.ones(2)], graphs=1, breaks=0)
