"""Assignment modes: at-least never lowers, covers only widens, exact is exact."""

from proxytune.tune import modes
from proxytune.tune.values import parse, render


def test_parse_kernel_and_profile_forms_agree():
    assert parse("32768\t60999\n") == parse([32768, 60999]) == parse("32768 60999") == (32768, 60999)
    assert parse("4096\n") == 4096
    assert parse(True) is True
    assert parse("bbr") == "bbr"
    assert render((1024, 65535)) == "1024 65535"


def test_at_least_never_lowers():
    assert modes.satisfied("at_least", 16384, 8192)
    assert not modes.satisfied("at_least", 4096, 8192)
    assert modes.target("at_least", 4096, 8192) == 8192
    # element-wise on vectors such as tcp_rmem: keep the larger of each
    assert modes.target("at_least", (4096, 262144, 8388608), (4096, 131072, 16777216)) == (4096, 262144, 16777216)


def test_at_most_and_covers():
    assert modes.satisfied("at_most", 30, 30) and not modes.satisfied("at_most", 60, 30)
    assert modes.target("at_most", 60, 30) == 30
    assert modes.satisfied("covers", (1024, 65535), (1024, 32768))
    assert not modes.satisfied("covers", (32768, 60999), (1024, 65535))
    # a wider current range is kept on the side that is already wider
    assert modes.target("covers", (2000, 65535), (1024, 32768)) == (1024, 65535)


def test_unlimited_satisfies_at_least():
    assert modes.satisfied("at_least", "unlimited", 65536)
    assert modes.satisfied("value", 1, 1) and not modes.satisfied("value", 2, 1)
