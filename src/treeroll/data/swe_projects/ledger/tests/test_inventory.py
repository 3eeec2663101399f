import pytest

from ledger.inventory import Inventory


def stocked():
    inventory = Inventory()
    inventory.add("bolt", 10, 25)
    inventory.add("nut", 3, 10)
    return inventory


def test_add_accumulates():
    inventory = stocked()
    inventory.add("bolt", 5, 30)
    assert inventory.quantity("bolt") == 15
    assert inventory.items["bolt"][1] == 30


def test_add_invalid():
    with pytest.raises(ValueError):
        Inventory().add("x", 0, 1)


def test_remove():
    inventory = stocked()
    inventory.remove("bolt", 4)
    assert inventory.quantity("bolt") == 6


def test_remove_all_deletes():
    inventory = stocked()
    inventory.remove("nut", 3)
    assert "nut" not in inventory.items


def test_remove_too_many():
    with pytest.raises(ValueError):
        stocked().remove("nut", 4)


def test_value():
    assert stocked().value() == 280


def test_low_stock():
    assert stocked().low_stock(5) == ["nut"]
    assert stocked().low_stock(3) == []
