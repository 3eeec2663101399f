import pytest

from ledger.accounts import Account, InsufficientFunds, total_balance, transfer


def test_deposit():
    account = Account("ann")
    assert account.deposit(500) == 500
    assert account.history == [("deposit", 500)]


def test_deposit_positive():
    with pytest.raises(ValueError):
        Account("ann").deposit(0)


def test_withdraw():
    account = Account("ann", 1000)
    assert account.withdraw(400) == 600


def test_withdraw_exact_balance():
    account = Account("ann", 300)
    assert account.withdraw(300) == 0


def test_overdraft():
    account = Account("ann", 100, overdraft=50)
    assert account.withdraw(150) == -50
    with pytest.raises(InsufficientFunds):
        account.withdraw(1)


def test_available():
    assert Account("ann", 100, overdraft=50).available() == 150


def test_negative_opening():
    with pytest.raises(ValueError):
        Account("ann", -1)


def test_transfer():
    a, b = Account("a", 1000), Account("b", 10)
    assert transfer(a, b, 250) == (750, 260)


def test_failed_transfer_changes_nothing():
    a, b = Account("a", 100), Account("b", 0)
    with pytest.raises(InsufficientFunds):
        transfer(a, b, 101)
    assert (a.balance, b.balance) == (100, 0)


def test_total_balance():
    assert total_balance([Account("a", 5), Account("b", 7)]) == 12
