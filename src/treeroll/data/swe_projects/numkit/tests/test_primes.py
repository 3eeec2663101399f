import pytest

from numkit.primes import factorize, gcd, is_prime, lcm, primes_up_to


def test_is_prime_small():
    assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]


def test_is_prime_square():
    assert not is_prime(49)
    assert is_prime(97)


def test_primes_up_to():
    assert primes_up_to(30) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]


def test_primes_up_to_small():
    assert primes_up_to(1) == []
    assert primes_up_to(2) == [2]


def test_factorize():
    assert factorize(360) == [2, 2, 2, 3, 3, 5]
    assert factorize(97) == [97]
    assert factorize(1) == []


def test_factorize_invalid():
    with pytest.raises(ValueError):
        factorize(0)


def test_gcd():
    assert gcd(48, 18) == 6
    assert gcd(-4, 6) == 2


def test_lcm():
    assert lcm(4, 6) == 12
    assert lcm(0, 5) == 0
