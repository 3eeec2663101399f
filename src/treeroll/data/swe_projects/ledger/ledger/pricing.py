"""Tiered prices, discounts and tax (integer cents, half-up rounding)."""

TIERS = [(100, 0.20), (50, 0.10), (10, 0.05)]


def round_cents(amount):
    """Round a non-negative amount of cents half-up to an integer."""
    return int(amount + 0.5)


def bulk_discount(quantity):
    """Discount rate for buying ``quantity`` units (largest tier reached)."""
    for minimum, rate in TIERS:
        if quantity >= minimum:
            return rate
    return 0.0


def line_total(unit_price, quantity):
    """Price of ``quantity`` units after the bulk discount."""
    gross = unit_price * quantity
    return round_cents(gross * (1 - bulk_discount(quantity)))


def apply_coupon(total, percent=0, fixed=0):
    """Apply a percentage then a fixed coupon; never below zero."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must lie in [0, 100]")
    discounted = round_cents(total * (100 - percent) / 100) - fixed
    return max(discounted, 0)


def with_tax(total, rate):
    """Add tax at ``rate`` (0.08 = 8%)."""
    return round_cents(total * (1 + rate))


def invoice(lines, percent=0, fixed=0, tax_rate=0.0):
    """Total of ``(unit_price, quantity)`` lines with coupon and tax."""
    subtotal = sum(line_total(price, quantity) for price, quantity in lines)
    return with_tax(apply_coupon(subtotal, percent, fixed), tax_rate)
