import pytest

from ledger.pricing import apply_coupon, bulk_discount, invoice, line_total, round_cents, with_tax


def test_round_cents():
    assert round_cents(10.5) == 11
    assert round_cents(10.49) == 10


def test_bulk_discount_tiers():
    assert bulk_discount(9) == 0.0
    assert bulk_discount(10) == 0.05
    assert bulk_discount(50) == 0.10
    assert bulk_discount(150) == 0.20


def test_line_total():
    assert line_total(100, 5) == 500
    assert line_total(100, 10) == 950


def test_coupon():
    assert apply_coupon(1000, percent=10) == 900
    assert apply_coupon(1000, fixed=150) == 850
    assert apply_coupon(100, fixed=500) == 0


def test_coupon_invalid():
    with pytest.raises(ValueError):
        apply_coupon(100, percent=101)


def test_tax():
    assert with_tax(1000, 0.08) == 1080


def test_invoice():
    assert invoice([(100, 10), (250, 2)], percent=10, tax_rate=0.1) == 1436
