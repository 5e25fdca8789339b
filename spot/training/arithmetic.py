"""Grade-school arithmetic word problems in GSM8K's format, generated from the project's own templates.

A problem is a question and a worked solution, one step per line, each step carrying GSM8K's calculator
annotation and ending in the final answer line:

    Question: Maya has 2 packs with 9 beads in each pack. She loses 11 of them. How many beads does Maya have now?
    Answer:
    Maya has 2 packs with 9 beads in each pack, so 2*9 = <<2*9=18>>18.
    She loses 11 of them, so 18-11 = <<18-11=7>>7.
    #### 7

A step line restates its clause of the question before the calculation, so its operands sit next to the
arithmetic: the model copies a nearby sentence and number instead of searching the question for them.

Every number is a positive integer and every operation a single binary + - * / with an exact integer result,
kept in a range a small model can compute (BOUNDS). Problems are drawn from scenario families (shopping, rates,
ages, sharing, collections, comparisons, ...) with 1 to 4 steps, names, objects, units and verbs varied per draw.

The split is by problem instance: a problem is held out when sha1 of its question text, as an integer, is 0 mod
HELDOUT_MODULUS. Generation is a pure function of the seed (numpy Generator), so a corpus is reproducible.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from spot.gsm8k import apply_op

HELDOUT_MODULUS = 20
PROMPT_PREFIX = "Question: "
ANSWER_HEADER = "\nAnswer:\n"


@dataclass(frozen=True)
class Bounds:
    """What each operation may compute (operands and results are positive integers)."""
    max_value: int = 99         # any operand or result: two digits at most
    max_factor: int = 9         # the smaller factor of a product
    max_multiplicand: int = 30  # the larger factor of a product
    max_divisor: int = 9
    max_quotient: int = 30


BOUNDS = Bounds()


@dataclass(frozen=True)
class Step:
    a: int
    op: str          # one of + - * /
    b: int
    line: str        # the solution line with "{calc}" where "a op b = <<a op b=c>>c" goes
    clause: str = ""     # the question's sentences this step reads its new numbers from (none: "")
    so: str = ""         # after a clause, what comes between "so" and the calculation ("in 5 years ")

    @property
    def value(self) -> int:
        return apply_op(self.a, self.op, self.b)

    def render(self) -> str:
        """The solution line: the step's clause restated, then its calculation ("Maya buys 3 packs of 8, so
        3*8 = <<3*8=24>>24."); a step that only combines earlier results says so in its own words."""
        calc = calculation(self.a, self.op, self.b)
        return f"{self.clause}, so {self.so}{calc}." if self.clause else self.line.replace("{calc}", calc)


def calculation(a: int, op: str, b: int) -> str:
    """GSM8K's calculation with its calculator annotation: '45+6 = <<45+6=51>>51'."""
    expr, value = f"{a}{op}{b}", apply_op(a, op, b)
    return f"{expr} = <<{expr}={value}>>{value}"


class Story:
    """A problem as it is told: sentences said, then the steps they lead to. A step's clause is the statements said
    since the previous step: the solution restates them before calculating, so each number a step needs stands
    just before its calculation (a small model copies a nearby span far more readily than it finds the k-th
    number of the question)."""

    def __init__(self):
        self.sentences: list[str] = []
        self.steps: list[Step] = []
        self._unsaid: list[str] = []

    def say(self, sentence: str) -> None:
        self.sentences.append(sentence)
        self._unsaid.append(sentence)

    def step(self, a: int, op: str, b: int, line: str, so: str = "") -> None:
        clause = " ".join(self._unsaid).removesuffix(".")
        self._unsaid = []
        self.steps.append(Step(a, op, b, line, clause, so))

    def problem(self, question: str, family: str) -> "Problem":
        return Problem(" ".join([*self.sentences, question]), tuple(self.steps), family)


@dataclass(frozen=True)
class Problem:
    question: str
    steps: tuple[Step, ...]
    family: str

    @property
    def answer(self) -> int:
        return self.steps[-1].value

    @property
    def solution(self) -> str:
        return "\n".join(s.render() for s in self.steps) + f"\n#### {self.answer}"

    @property
    def prompt(self) -> str:
        return format_prompt(self.question)

    @property
    def text(self) -> str:
        return self.prompt + self.solution


def format_prompt(question: str) -> str:
    """The text a model is given: the question and the answer header (the solution follows on the next line)."""
    return PROMPT_PREFIX + question + ANSWER_HEADER


def is_heldout(question: str) -> bool:
    return int(hashlib.sha1(question.encode("utf-8")).hexdigest(), 16) % HELDOUT_MODULUS == 0


# -- vocabulary of the stories ---------------------------------------------------------------------------------
NAMES = [("Maya", "she"), ("Omar", "he"), ("Lena", "she"), ("James", "he"), ("Sofia", "she"), ("Ravi", "he"),
         ("Emma", "she"), ("Noah", "he"), ("Aisha", "she"), ("Lucas", "he"), ("Chloe", "she"), ("Mateo", "he"),
         ("Priya", "she"), ("Ethan", "he"), ("Hana", "she"), ("Diego", "he"), ("Zoe", "she"), ("Samuel", "he"),
         ("Nora", "she"), ("Kenji", "he"), ("Grace", "she"), ("Leo", "he"), ("Amara", "she"), ("Felix", "he"),
         ("Ivy", "she"), ("Marcus", "he"), ("Julia", "she"), ("Tariq", "he"), ("Elena", "she"), ("Ben", "he"),
         ("Rosa", "she"), ("Carlos", "he"), ("Mia", "she"), ("Hugo", "he"), ("Lucy", "she"), ("Arjun", "he"),
         ("Nina", "she"), ("Owen", "he"), ("Fatima", "she"), ("Jack", "he")]

# (singular, plural)
ITEMS = [("apple", "apples"), ("pencil", "pencils"), ("marble", "marbles"), ("sticker", "stickers"),
         ("cookie", "cookies"), ("book", "books"), ("shell", "shells"), ("card", "cards"), ("egg", "eggs"),
         ("orange", "oranges"), ("toy car", "toy cars"), ("balloon", "balloons"), ("cupcake", "cupcakes"),
         ("flower", "flowers"), ("stamp", "stamps"), ("crayon", "crayons"), ("muffin", "muffins"),
         ("candle", "candles"), ("button", "buttons"), ("bead", "beads"), ("rock", "rocks"), ("lemon", "lemons"),
         ("peach", "peaches"), ("coin", "coins"), ("puzzle", "puzzles"), ("ribbon", "ribbons"), ("plant", "plants"),
         ("notebook", "notebooks"), ("sandwich", "sandwiches"), ("tomato", "tomatoes")]

CONTAINERS = [("box", "boxes"), ("bag", "bags"), ("basket", "baskets"), ("jar", "jars"), ("crate", "crates"),
              ("pack", "packs"), ("tray", "trays"), ("bucket", "buckets")]

# things sold with a price each: (singular, plural)
GOODS = [("notebook", "notebooks"), ("pen", "pens"), ("ticket", "tickets"), ("sandwich", "sandwiches"),
         ("T-shirt", "T-shirts"), ("toy", "toys"), ("cake", "cakes"), ("comic book", "comic books"),
         ("bottle of juice", "bottles of juice"), ("plant", "plants"), ("lamp", "lamps"), ("hat", "hats"),
         ("ball", "balls"), ("kite", "kites"), ("board game", "board games"), ("scarf", "scarves")]

# (activity unit plural, verb phrase, per-day noun)
RATES = [("pages", "reads", "day"), ("miles", "runs", "day"), ("laps", "swims", "day"),
         ("words", "writes", "day"), ("cookies", "bakes", "day"), ("emails", "answers", "day"),
         ("bricks", "lays", "hour"), ("boxes", "packs", "hour"), ("photos", "takes", "hour"),
         ("trees", "plants", "hour")]

PLACES = ["the market", "the fair", "the bakery", "the book store", "the garden center", "the school shop",
          "the toy store", "the museum shop"]

FRIENDS_WORDS = ["friends", "classmates", "cousins", "neighbors", "teammates"]


# -- building blocks -------------------------------------------------------------------------------------------
class Draw:
    """Seeded choices for one problem: rng is a numpy Generator owned by the caller (no global state)."""

    def __init__(self, rng: np.random.Generator, bounds: Bounds = BOUNDS):
        self.rng, self.bounds = rng, bounds

    def int(self, lo: int, hi: int) -> int:
        """Uniform in lo..hi inclusive (hi < lo is a bug in a template, not a user error)."""
        if hi < lo:
            raise ValueError(f"empty range {lo}..{hi}")
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def people(self, n: int) -> list[tuple[str, str]]:
        idx = self.rng.choice(len(NAMES), size=n, replace=False)
        return [NAMES[int(i)] for i in idx]

    def addend(self, current: int, lo: int = 2) -> int:
        return self.int(lo, max(lo, min(self.bounds.max_value - current, 60)))

    def subtrahend(self, current: int) -> int:
        return self.int(1, current - 1)

    def factor(self, current: int) -> int | None:
        """k in 2..max_factor with current*k in bounds (current must be a multiplicand), or None."""
        if current > self.bounds.max_multiplicand:
            return None
        ks = [k for k in range(2, self.bounds.max_factor + 1) if current * k <= self.bounds.max_value]
        return self.pick(ks) if ks else None

    def divisor(self, current: int) -> int | None:
        ks = [k for k in range(2, self.bounds.max_divisor + 1)
              if current % k == 0 and current // k <= self.bounds.max_quotient]
        return self.pick(ks) if ks else None

    def product(self) -> tuple[int, int]:
        """(a, b): a multiplicand in 2..max_multiplicand, b a factor in 2..max_factor, a*b in bounds."""
        b = self.int(2, self.bounds.max_factor)
        a = self.int(2, min(self.bounds.max_multiplicand, self.bounds.max_value // b))
        return a, b

    def quotient(self) -> tuple[int, int]:
        """(a, b) with a/b exact: b a divisor, a/b in 2..max_quotient."""
        b = self.int(2, self.bounds.max_divisor)
        q = self.int(2, min(self.bounds.max_quotient, self.bounds.max_value // b))
        return q * b, b


def cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def possessive(pronoun: str) -> str:
    return {"she": "her", "he": "his"}[pronoun]


def objective(pronoun: str) -> str:
    return {"she": "her", "he": "him"}[pronoun]


# -- scenario families: each builds a problem of n_steps steps, or None when this draw cannot (make_problem
# then draws again) ----------------------------------------------------------------------------------------------
def story_chain(d: Draw, n_steps: int) -> Problem | None:
    """One person's collection changes: gains, losses, packs bought, doubling, equal sharing at the end."""
    (name, he), (friend, _) = d.people(2)
    item, items = d.pick(ITEMS)
    story = Story()
    if n_steps >= 2 and d.rng.random() < 0.5:     # the opening may itself be a step: packs of items
        box, boxes = d.pick(CONTAINERS)
        a, b = d.product()
        story.say(f"{name} has {a} {boxes} with {b} {items} in each {box}.")
        story.step(a, "*", b, "At first there are {calc}.")
        current = a * b
    else:
        current = d.int(8, 90)
        story.say(f"{name} has {current} {items}.")
    question = f"How many {items} does {name} have now?"
    while len(story.steps) < n_steps:
        last = len(story.steps) == n_steps - 1
        kind = d.pick(["gain", "lose", "packs", "double", "share"])
        if kind == "share":
            k = d.divisor(current)
            if not last or k is None:
                continue
            group = d.pick(FRIENDS_WORDS)
            story.say(f"{cap(he)} shares them equally among {k} {group}.")
            question = f"How many {items} does each of the {group} get?"
            story.step(current, "/", k, "Each one gets {calc}.")
        elif kind == "double":
            k = d.factor(current)
            if k is None:
                continue
            if k in (2, 3):
                word = {2: "doubles", 3: "triples"}[k]
                story.say(f"Then {he} {word} the number of {items} {he} has.")
            else:
                story.say(f"Then {he} ends up with {k} times as many {items} as before.")
            story.step(current, "*", k, "Then there are {calc}.")
        elif kind == "packs":
            box, boxes = d.pick(CONTAINERS)
            a, b = d.product()
            if last or current + a * b > d.bounds.max_value:
                continue
            story.say(f"{cap(he)} buys {a} {boxes} of {items} with {b} in each {box}.")
            story.step(a, "*", b, "The new ones are {calc}.")
            story.step(current, "+", a * b, "So there are {calc}.")
        elif kind == "gain":
            b = d.addend(current)
            verb = d.pick([f"finds {b} more", f"gets {b} more from {friend}", f"buys {b} more",
                           f"is given {b} more"])
            story.say(f"{cap(he)} {verb}.")
            story.step(current, "+", b, "After getting more there are {calc}.")
        else:
            if current < 3:
                continue
            b = d.subtrahend(current)
            verb = d.pick([f"gives {b} to {friend}", f"loses {b} of them", f"uses {b} of them",
                           f"sells {b} of them"])
            story.say(f"{cap(he)} {verb}.")
            story.step(current, "-", b, "After that {calc} are left.")
        current = story.steps[-1].value
    return story.problem(question, "story_chain")


def shopping(d: Draw, n_steps: int) -> Problem | None:
    """Items bought at a price each; a second kind of item or a fee; paying; change."""
    (name, he), = d.people(1)
    place = d.pick(PLACES)
    (g1, g1s), (g2, g2s) = [GOODS[int(i)] for i in d.rng.choice(len(GOODS), size=2, replace=False)]
    n1, p1 = d.product()
    story = Story()
    story.say(f"At {place}, {name} buys {n1} {g1s} for ${p1} each.")
    story.step(n1, "*", p1, "The first ones cost {calc} dollars.")
    question = f"How much does {name} spend?"
    if n_steps >= 3:
        n2, p2 = d.product()
        story.say(f"{cap(he)} also buys {n2} {g2s} for ${p2} each.")
        story.step(n2, "*", p2, "The second ones cost {calc} dollars.")
        story.step(n1 * p1, "+", n2 * p2, "In total that is {calc} dollars.")
    elif n_steps == 2 and d.rng.random() < 0.5:
        extra = d.addend(n1 * p1)
        story.say(f"{cap(he)} also pays ${extra} for a {g2}.")
        story.step(n1 * p1, "+", extra, "In total that is {calc} dollars.")
        question = f"How much money does {name} spend in all?"
    if len(story.steps) < n_steps:
        total = story.steps[-1].value
        if total >= d.bounds.max_value:
            return None
        paid = d.int(total + 1, min(d.bounds.max_value, total + 80))
        story.say(f"{cap(he)} pays with ${paid}.")
        story.step(paid, "-", total, "The change is {calc} dollars.")
        question = f"How much change does {name} get?"
    return story.problem(question, "shopping")


def rates(d: Draw, n_steps: int) -> Problem | None:
    """A rate over a number of days or hours, a second stretch, then a goal or an extra amount."""
    (name, he), = d.people(1)
    unit, verb, per = d.pick(RATES)
    r, t = d.product()
    story = Story()
    story.say(f"{name} {verb} {r} {unit} every {per} for {t} {per}s.")
    story.step(r, "*", t, "At first that is {calc}.")
    question = f"How many {unit} does {name} finish in all?"
    if n_steps >= 3:
        r2, t2 = d.product()
        story.say(f"After that, {he} {verb} {r2} {unit} every {per} for {t2} more {per}s.")
        story.step(r2, "*", t2, "Later that is {calc}.")
        story.step(r * t, "+", r2 * t2, "Altogether that is {calc}.")
    if len(story.steps) < n_steps:
        total = story.steps[-1].value
        if d.rng.random() < 0.5 and total < d.bounds.max_value - 2:
            goal = d.int(total + 1, min(d.bounds.max_value, total + 90))
            story.say(f"{possessive(he).capitalize()} goal is {goal} {unit}.")
            story.step(goal, "-", total, "Still needed: {calc}.")
            question = f"How many more {unit} does {name} need to reach the goal?"
        else:
            extra = d.addend(total)
            story.say(f"On the last {per} {he} {verb} {extra} extra {unit}.")
            story.step(total, "+", extra, "With the extra that is {calc}.")
    return story.problem(question, "rates")


def comparison(d: Draw, n_steps: int) -> Problem | None:
    """People's counts defined from each other: more than, fewer than, times as many, together."""
    people = [n for n, _ in d.people(5)]
    item, items = d.pick(ITEMS)
    current, who = d.int(5, 60), people[0]
    story = Story()
    story.say(f"{who} has {current} {items}.")
    question = None
    for name in people[1:]:
        if len(story.steps) == n_steps:
            break
        if len(story.steps) == n_steps - 1 and story.steps and d.rng.random() < 0.4:
            prev = story.steps[-2].value if len(story.steps) >= 2 else story.steps[-1].a
            prev_name = people[len(story.steps) - 1]
            question = f"How many {items} do {prev_name} and {who} have together?"
            story.step(prev, "+", current, "Together they have {calc}.")
            break
        kind = d.pick(["more", "fewer", "times"])
        k = d.factor(current) if kind == "times" else None
        if k is not None:
            word = {2: "twice", 3: "three times", 4: "four times", 5: "five times"}.get(k, f"{k} times")
            story.say(f"{name} has {word} as many {items} as {who}.")
            story.step(current, "*", k, "The next one has {calc}.")
        elif kind == "fewer" and current >= 3:
            b = d.subtrahend(current)
            story.say(f"{name} has {b} fewer {items} than {who}.")
            story.step(current, "-", b, "The next one has {calc}.")
        else:
            b = d.addend(current)
            story.say(f"{name} has {b} more {items} than {who}.")
            story.step(current, "+", b, "The next one has {calc}.")
        current, who = story.steps[-1].value, name
    question = question or f"How many {items} does {who} have?"
    return story.problem(question, "comparison")


def ages(d: Draw, n_steps: int) -> Problem | None:
    """Ages now and later: times as old, older / younger, in some years, a sum."""
    (n1, _), (n2, _) = d.people(2)
    a = d.int(4, 40)
    story = Story()
    story.say(f"{n1} is {a} years old.")
    current, who = a, n1
    if n_steps >= 2 and d.rng.random() < 0.5:
        k = d.factor(a)
        if k is None or a * k > 90:
            return None
        story.say(f"Their aunt is {k} times as old as {n1}.")
        story.step(a, "*", k, "The aunt is {calc} years old.")
        current, who = a * k, "the aunt"
    if len(story.steps) < n_steps - 1 or (len(story.steps) == n_steps - 1 and d.rng.random() < 0.5):
        b = d.int(2, 30)
        if d.rng.random() < 0.5 or current <= b:
            story.say(f"{n2} is {b} years older than {who}.")
            story.step(current, "+", b, "The next one is {calc} years old.")
        else:
            story.say(f"{n2} is {b} years younger than {who}.")
            story.step(current, "-", b, "The next one is {calc} years old.")
        current, who = story.steps[-1].value, n2
    if len(story.steps) == n_steps:
        return story.problem(f"How old is {who}?", "ages")
    if len(story.steps) == n_steps - 2:
        story.step(a, "+", current, "Together they are {calc} years old.")
        years = d.int(2, 30)
        story.say(f"Their grandfather is {years} years older than {n1} and {who} together.")
        story.step(a + current, "+", years, "The grandfather is {calc} years old.")
        return story.problem("How old is their grandfather?", "ages")
    years = d.int(2, 25)
    story.step(current, "+", years, f"In {years} years the age will be {{calc}}.", so=f"in {years} years ")
    return story.problem(f"How old will {who} be in {years} years?", "ages")


def sharing(d: Draw, n_steps: int) -> Problem | None:
    """Made or picked, some eaten or given away, the rest packed equally, maybe one container topped up."""
    (name, he), = d.people(1)
    item, items = d.pick(ITEMS)
    box, boxes = d.pick(CONTAINERS)
    if n_steps == 1:
        total, k = d.quotient()
        story = Story()
        story.say(f"{name} packs {total} {items} equally into {k} {boxes}.")
        story.step(total, "/", k, "Each one holds {calc}.")
        return story.problem(f"How many {items} are in each {box}?", "sharing")
    story = Story()
    if n_steps >= 3:
        batches, per = d.product()
        made = batches * per
        story.say(f"{name} makes {batches} batches of {items} with {per} in each batch.")
        story.step(batches, "*", per, "At first there are {calc}.")
    else:
        made = d.int(10, 95)
        story.say(f"{name} has {made} {items}.")
    options = [(k, e) for k in range(2, d.bounds.max_divisor + 1) for e in range(1, min(40, made - 2) + 1)
               if (made - e) % k == 0 and 2 <= (made - e) // k <= d.bounds.max_quotient]
    if not options:
        return None
    k, eaten = d.pick(options)
    kept = made - eaten
    verb = d.pick(["eats", "gives away", "keeps", "sells"])
    story.say(f"{cap(he)} {verb} {eaten} of them and packs the rest equally into {k} {boxes}.")
    story.step(made, "-", eaten, "After that {calc} are left.")
    story.step(kept, "/", k, "Each one holds {calc}.")
    question = f"How many {items} are in each {box}?"
    if len(story.steps) < n_steps:
        m = d.int(2, 30)
        story.say(f"Later {he} adds {m} more {items} to one {box}.")
        story.step(kept // k, "+", m, "That one now holds {calc}.")
        question = f"How many {items} are in that {box} now?"
    return story.problem(question, "sharing")


def savings(d: Draw, n_steps: int) -> Problem | None:
    """Money saved per week, money already there, something bought, the rest shared."""
    (name, he), = d.people(1)
    good, _ = d.pick(GOODS)
    w, s = d.product()
    story = Story()
    total = s * w
    if n_steps >= 2:
        start = d.addend(total, lo=3)
        story.say(f"{name} has ${start} in a piggy bank.")
        story.say(f"{cap(he)} saves ${s} more every week for {w} weeks.")
        story.step(s, "*", w, "The savings are {calc} dollars.")
        story.step(start, "+", total, "Now there are {calc} dollars.")
        total += start
    else:
        story.say(f"{name} saves ${s} every week for {w} weeks.")
        story.step(s, "*", w, "The savings are {calc} dollars.")
    question = f"How much money does {name} have?"
    if n_steps >= 3:
        if total < 4:
            return None
        price = d.int(2, total - 1)
        story.say(f"{cap(he)} spends ${price} on a {good}.")
        story.step(total, "-", price, "After buying, {calc} dollars are left.")
        total -= price
        question = f"How much money does {name} have left?"
    if n_steps >= 4:
        k = d.divisor(total)
        if k is None:
            return None
        story.say(f"{cap(he)} splits the rest equally among {k} {d.pick(FRIENDS_WORDS)}.")
        story.step(total, "/", k, "Each one gets {calc} dollars.")
        question = "How many dollars does each one get?"
    return story.problem(question, "savings")


def seating(d: Draw, n_steps: int) -> Problem | None:
    """Rows and chairs, shelves and books, teams and players: a grid, then changes and equal groups."""
    (name, _), = d.people(1)
    groups, things, where, group = d.pick([("rows", "chairs", "the hall", "row"),
                                           ("shelves", "books", "the library", "shelf"),
                                           ("teams", "players", "the tournament", "team"),
                                           ("tables", "guests", "the party", "table"),
                                           ("buses", "students", "the trip", "bus")])
    a, b = d.product()
    story = Story()
    story.say(f"In {where} there are {a} {groups} with {b} {things} in each {group}.")
    story.step(a, "*", b, "There are {calc} in all.")
    question = f"How many {things} are there?"
    total = a * b
    if n_steps >= 2:
        if d.rng.random() < 0.5 and total > 3:
            c = d.subtrahend(total)
            story.say(f"{c} of the {things} leave early.")
            story.step(total, "-", c, "After that {calc} stay.")
            question = f"How many {things} stay?"
        else:
            c = d.addend(total)
            story.say(f"{name} brings {c} more {things}.")
            story.step(total, "+", c, "Now there are {calc}.")
        total = story.steps[-1].value
    if n_steps >= 3:
        k = d.divisor(total)
        if k is None:
            return None
        story.say(f"{name} puts all of them into {k} equal groups.")
        story.step(total, "/", k, "Each group has {calc}.")
        question = f"How many {things} are in each group?"
        total = story.steps[-1].value
    if n_steps >= 4:
        m = d.addend(total)
        story.say(f"Then {m} more {things} join one of the groups.")
        story.step(total, "+", m, "That group has {calc}.")
        question = f"How many {things} are in that group?"
    return story.problem(question, "seating")


FAMILIES: dict[str, Callable[[Draw, int], Problem | None]] = {
    "story_chain": story_chain, "shopping": shopping, "rates": rates, "comparison": comparison, "ages": ages,
    "sharing": sharing, "savings": savings, "seating": seating,
}


def within_bounds(p: Problem, bounds: Bounds = BOUNDS) -> bool:
    """Every step's operands and result are positive integers in range, products and quotients in theirs."""
    for s in p.steps:
        try:
            v = s.value
        except ValueError:
            return False
        if min(s.a, s.b, v) < 1 or max(s.a, s.b, v) > bounds.max_value:
            return False
        if s.op == "*" and (min(s.a, s.b) > bounds.max_factor or max(s.a, s.b) > bounds.max_multiplicand):
            return False
        if s.op == "/" and (s.b > bounds.max_divisor or v > bounds.max_quotient):
            return False
    return True


def make_problem(rng: np.random.Generator, bounds: Bounds = BOUNDS) -> Problem:
    """One problem: a family and a step count (1..4) drawn uniformly, retried until it is within bounds."""
    d = Draw(rng, bounds)
    names = sorted(FAMILIES)
    while True:
        family = names[int(rng.integers(len(names)))]
        n_steps = int(rng.integers(1, 5))
        p = FAMILIES[family](d, n_steps)
        if p is not None and len(p.steps) == n_steps and within_bounds(p, bounds):
            return p


def generate_problems(n: int, seed: int, heldout: bool | None = None,
                      bounds: Bounds = BOUNDS) -> list[Problem]:
    """n distinct problems from the seeded stream; heldout True / False keeps only that split (None: both)."""
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    while len(out) < n:
        p = make_problem(rng, bounds)
        if p.question in seen or (heldout is not None and is_heldout(p.question) != heldout):
            continue
        seen.add(p.question)
        out.append(p)
    return out


# -- practice lines --------------------------------------------------------------------------------------------
# A word problem's steps draw their facts unevenly: in the shipped corpus each of the ~240 products appeared ~280
# times but each of the ~4,800 sums ~14 times and each difference ~9, and the model learned to multiply, not to
# add. Practice lines are one calculation in a step's exact annotation format ("45+6 = <<45+6=51>>51."), its fact
# drawn uniformly from its operation's whole table, so every fact in BOUNDS is practised alike.
PRACTICE_OPS = ("+", "-", "*", "/")


def fact_table(op: str, bounds: Bounds = BOUNDS) -> list[tuple[int, int]]:
    """Every (a, b) a step may compute with `op`: operands and result positive integers <= max_value; a product has
    a factor <= max_factor and the other <= max_multiplicand (either order); a quotient is exact, its divisor
    <= max_divisor and the quotient <= max_quotient."""
    top = bounds.max_value
    if op == "+":
        return [(a, b) for a in range(1, top) for b in range(1, top - a + 1)]
    if op == "-":
        return [(a, b) for a in range(2, top + 1) for b in range(1, a)]
    if op == "*":
        pairs = {(m, f) for f in range(1, bounds.max_factor + 1) for m in range(1, bounds.max_multiplicand + 1)
                 if m * f <= top}
        return sorted(pairs | {(f, m) for m, f in pairs})
    if op == "/":
        return [(q * d, d) for d in range(1, bounds.max_divisor + 1) for q in range(1, bounds.max_quotient + 1)
                if q * d <= top]
    raise ValueError(f"unknown operation {op!r}")


FACT_TABLES = {op: fact_table(op) for op in PRACTICE_OPS}


def practice_line(a: int, op: str, b: int) -> str:
    """One calculation as a solution line writes it: '45+6 = <<45+6=51>>51.'"""
    return calculation(a, op, b) + "."
