"""A stock inventory."""


class Inventory:
    """Items with a quantity and a unit price (cents)."""

    def __init__(self):
        self.items = {}

    def add(self, name, quantity, price):
        """Add stock; a new price replaces the old one."""
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        count, _ = self.items.get(name, (0, price))
        self.items[name] = (count + quantity, price)

    def remove(self, name, quantity):
        """Take stock out; ``KeyError`` if unknown, ``ValueError`` if not enough."""
        count, price = self.items[name]
        if quantity > count:
            raise ValueError(f"only {count} {name} in stock")
        if quantity == count:
            del self.items[name]
        else:
            self.items[name] = (count - quantity, price)

    def quantity(self, name):
        """Units in stock (0 if unknown)."""
        return self.items.get(name, (0, 0))[0]

    def value(self):
        """Total value of the stock."""
        return sum(count * price for count, price in self.items.values())

    def low_stock(self, threshold):
        """Names with fewer than ``threshold`` units, sorted."""
        return sorted(name for name, (count, _) in self.items.items() if count < threshold)
