"""Where the corpus draws its entities: large pools, split into a training and a held-out part.

The model must *copy* argument values from the prompt or from tool results, never recall them,
so every pool is large, and the evaluation draws from parts training never sees:

* real names (cities, people, companies, countries) are split by a hash of the name into
  training (about 85%) and held-out (the rest) — `Pools(split)`;
* made-up words are built from pieces of the real vocabulary (alphabetic tokens of 2-9 letters),
  so a copied word can be any mix of thousands of pieces; a hash of the word assigns it to one
  split, and each split draws again until it has one of its own (`_own`), so no held-out word
  is ever a training word, while the pieces themselves are shared (a model can only write
  tokens it was trained on);
* a share of made-up names (`Pools.vocabulary_names`, default none) are instead one of the
  vocabulary's capitalised words, with at most one piece after it, so that the corpus's calls
  and JSON values open with any of the 12,744 ids a spelling drill teaches (`training/spelling.py`),
  not only with the ~3,400 short pieces made-up words begin with (`ĠAk`, `ĠOtt`);
* numbers are drawn fresh (integers, decimals, amounts, dates, ids), which no split needs.

Only the country -> capital table is meant to be remembered (short factual answers); it is the
same in both splits.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from functools import cache

TRAIN, HELD_OUT = "train", "held_out"
SPLITS = (TRAIN, HELD_OUT)

CITIES = """
Paris Oslo Tokyo Berlin Madrid Rome Lisbon Vienna Prague Warsaw Budapest Athens Dublin London Amsterdam
Brussels Copenhagen Stockholm Helsinki Reykjavik Tallinn Riga Vilnius Kyiv Bucharest Sofia Belgrade Zagreb
Ljubljana Sarajevo Skopje Tirana Valletta Nicosia Ankara Istanbul Cairo Tunis Algiers Rabat Casablanca Dakar
Accra Lagos Abuja Nairobi Kampala Kigali Addis Ababa Khartoum Luanda Harare Lusaka Maputo Johannesburg
Cape Town Durban Windhoek Gaborone Antananarivo Moscow Minsk Tbilisi Yerevan Baku Tehran Baghdad Riyadh Doha
Dubai Muscat Kuwait Amman Beirut Damascus Jerusalem Karachi Lahore Islamabad Delhi Mumbai Chennai Kolkata
Bangalore Hyderabad Pune Jaipur Dhaka Colombo Kathmandu Thimphu Yangon Bangkok Hanoi Saigon Vientiane Phnom
Penh Manila Cebu Jakarta Surabaya Bandung Singapore Kuala Lumpur Penang Beijing Shanghai Shenzhen Guangzhou
Chengdu Wuhan Xian Nanjing Hangzhou Tianjin Harbin Seoul Busan Incheon Osaka Kyoto Nagoya Sapporo Fukuoka
Taipei Kaohsiung Ulaanbaatar Almaty Tashkent Bishkek Dushanbe Kabul Sydney Melbourne Brisbane Perth Adelaide
Auckland Wellington Christchurch Suva Honolulu Anchorage Vancouver Calgary Edmonton Winnipeg Toronto Ottawa
Montreal Quebec Halifax Seattle Portland Sacramento Oakland Fresno Denver Phoenix Tucson Dallas Houston
Austin Chicago Detroit Cleveland Boston Atlanta Miami Orlando Tampa Nashville Memphis Baltimore Philadelphia
Pittsburgh Buffalo Newark Richmond Charlotte Raleigh Omaha Boise Reno Albuquerque Minneapolis Milwaukee
Havana Kingston Nassau Mexico Monterrey Guadalajara Tijuana Puebla Guatemala Managua Panama Bogota Medellin
Cali Quito Guayaquil Lima Cusco Arequipa Santiago Valparaiso Mendoza Cordoba Rosario Montevideo Asuncion
Caracas Maracaibo Recife Salvador Fortaleza Brasilia Manaus Belem Curitiba Porto Alegre Rio Sao Paulo
Marseille Lyon Toulouse Nice Nantes Strasbourg Bordeaux Lille Rennes Grenoble Geneva Zurich Basel Bern
Lausanne Munich Hamburg Cologne Frankfurt Stuttgart Dresden Leipzig Hanover Bremen Nuremberg Milan Naples
Turin Palermo Genoa Bologna Florence Venice Verona Bari Seville Valencia Bilbao Malaga Zaragoza Granada Porto
Braga Rotterdam Utrecht Eindhoven Antwerp Ghent Bruges Liege Aarhus Odense Bergen Trondheim Stavanger
Gothenburg Malmo Uppsala Turku Tampere Oulu Gdansk Krakow Wroclaw Poznan Lodz Brno Ostrava Bratislava Kosice
Graz Linz Salzburg Innsbruck Debrecen Szeged Cluj Iasi Timisoara Varna Plovdiv Thessaloniki Patras Izmir
Antalya Manchester Liverpool Leeds Bristol Glasgow Edinburgh Aberdeen Cardiff Belfast Cork Galway Oxford
Cambridge Brighton York Bath Dundee
"""

COUNTRY_CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Iceland": "Reykjavik",
    "Ireland": "Dublin",
    "Austria": "Vienna",
    "Poland": "Warsaw",
    "Hungary": "Budapest",
    "Greece": "Athens",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Switzerland": "Bern",
    "Czechia": "Prague",
    "Slovakia": "Bratislava",
    "Slovenia": "Ljubljana",
    "Croatia": "Zagreb",
    "Serbia": "Belgrade",
    "Romania": "Bucharest",
    "Bulgaria": "Sofia",
    "Estonia": "Tallinn",
    "Latvia": "Riga",
    "Lithuania": "Vilnius",
    "Ukraine": "Kyiv",
    "Russia": "Moscow",
    "Turkey": "Ankara",
    "Egypt": "Cairo",
    "Morocco": "Rabat",
    "Tunisia": "Tunis",
    "Algeria": "Algiers",
    "Kenya": "Nairobi",
    "Nigeria": "Abuja",
    "Ghana": "Accra",
    "Senegal": "Dakar",
    "Ethiopia": "Addis Ababa",
    "Uganda": "Kampala",
    "Rwanda": "Kigali",
    "Angola": "Luanda",
    "Zambia": "Lusaka",
    "Zimbabwe": "Harare",
    "Namibia": "Windhoek",
    "Botswana": "Gaborone",
    "Madagascar": "Antananarivo",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Saudi Arabia": "Riyadh",
    "Qatar": "Doha",
    "Oman": "Muscat",
    "Jordan": "Amman",
    "Lebanon": "Beirut",
    "Syria": "Damascus",
    "Pakistan": "Islamabad",
    "India": "New Delhi",
    "Bangladesh": "Dhaka",
    "Nepal": "Kathmandu",
    "Bhutan": "Thimphu",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Laos": "Vientiane",
    "Cambodia": "Phnom Penh",
    "Philippines": "Manila",
    "Indonesia": "Jakarta",
    "Malaysia": "Kuala Lumpur",
    "China": "Beijing",
    "Japan": "Tokyo",
    "South Korea": "Seoul",
    "Mongolia": "Ulaanbaatar",
    "Kazakhstan": "Astana",
    "Uzbekistan": "Tashkent",
    "Kyrgyzstan": "Bishkek",
    "Tajikistan": "Dushanbe",
    "Afghanistan": "Kabul",
    "Australia": "Canberra",
    "New Zealand": "Wellington",
    "Fiji": "Suva",
    "Canada": "Ottawa",
    "United States": "Washington",
    "Mexico": "Mexico City",
    "Cuba": "Havana",
    "Jamaica": "Kingston",
    "Guatemala": "Guatemala City",
    "Nicaragua": "Managua",
    "Panama": "Panama City",
    "Colombia": "Bogota",
    "Ecuador": "Quito",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Argentina": "Buenos Aires",
    "Uruguay": "Montevideo",
    "Paraguay": "Asuncion",
    "Venezuela": "Caracas",
    "Brazil": "Brasilia",
    "Bolivia": "Sucre",
    "Georgia": "Tbilisi",
    "Armenia": "Yerevan",
    "Azerbaijan": "Baku",
    "Belarus": "Minsk",
    "Albania": "Tirana",
    "Malta": "Valletta",
    "Cyprus": "Nicosia",
    "Luxembourg": "Luxembourg",
    "Sri Lanka": "Colombo",
    "Myanmar": "Naypyidaw",
    "Singapore": "Singapore",
    "Sudan": "Khartoum",
    "Mozambique": "Maputo",
    "South Africa": "Pretoria",
    "Bahamas": "Nassau",
    "Israel": "Jerusalem",
}

FIRST_NAMES = """
Anna Ben Clara David Elena Farid Greta Hugo Ines Jonas Karin Leon Maya Nils Olga Pablo Quinn Rosa Sami Tara
Umar Vera Willem Xenia Yusuf Zoe Amira Bruno Chiara Dmitri Emil Fatima Gustav Hana Igor Julia Kenji Lena
Mateo Nadia Oscar Priya Rafael Sofia Tomas Ulla Viktor Wanda Yara Aiko Bianca Carlos Dana Erik Freya
Gabriel Helga Ivan Jasmine Kai Lucia Marco Nora Omar Paula Ravi Selma Theo Uma Valentin Wilma Ada Boris
Cora Diego Edith Felix Gina Henrik Isla Jakob Kira Lars Mira Noah Ola Petra Rami Saskia Timo Ursula Vito
Alma Basil Celine Dario Elif Filip Greer Hamza Ida Jonah Kaia Luka Mina Nico Orla Pia Remy Sana Tobias
Liam Emma Olivia Lucas Mia Amelia Ethan Chloe Leo Aria Mason Ivy Elias Ruby Adam Stella Arjun Mei Wei Chen
Sipho Thandiwe Kwame Amara Chidi Zainab Ayumi Haruto Minjun Seoyeon Anh Linh Bao Rohan Ananya Diya
"""

SURNAMES = """
Smith Jensen Garcia Rossi Novak Kowalski Muller Dubois Silva Costa Tanaka Kim Nguyen Patel Singh Haddad
Okafor Mensah Larsen Berg Nieminen Horvat Popescu Ivanova Schmidt Moreau Romano Santos Ferreira Suzuki
Park Tran Sharma Khan Cohen Levi Adeyemi Osei Lindqvist Virtanen Kovacs Dimitrov Petrov Fischer Weber
Laurent Bianchi Ricci Lopez Martinez Hernandez Sato Watanabe Lee Choi Pham Gupta Mehta Rahman Farouk
Banda Moyo Eriksen Holm Koskinen Szabo Stoica Georgiev Volkov Keller Wagner Lefebvre Colombo Marino Diaz
"""

COMPANY_SUFFIXES = ("GmbH", "Ltd", "Inc", "AG", "SA", "BV", "Oy", "AB", "LLC", "Co", "Corp", "SRL")

# Pieces of the real vocabulary that make pronounceable made-up words.
_WORD_PIECE = re.compile(r"^[a-z]{2,9}$")


def in_split(name: str, split: str) -> bool:
    """Whether a name belongs to `split` by its hash (about 15% are held out); a real name is
    held out only if the training pools cannot also draw it (`real_in_split`)."""
    held_out = hashlib.sha256(name.encode()).digest()[0] < 38
    return held_out == (split == HELD_OUT)


def _names(text: str) -> list[str]:
    return text.split()


def _cities() -> list[str]:
    """CITIES lists one word per name, except the two-word names joined below."""
    words = CITIES.split()
    joined = {
        ("Addis", "Ababa"),
        ("Cape", "Town"),
        ("Phnom", "Penh"),
        ("Kuala", "Lumpur"),
        ("Porto", "Alegre"),
        ("Sao", "Paulo"),
    }
    out, i = [], 0
    while i < len(words):
        if i + 1 < len(words) and (words[i], words[i + 1]) in joined:
            out.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            out.append(words[i])
            i += 1
    return out


@cache
def word_pieces() -> tuple[str, ...]:
    """Lower-case alphabetic tokens of the V4.1 vocabulary (2-9 letters), in id order."""
    from sglang_ds41.encoding.prompt_ids import text_tokenizer

    vocab = text_tokenizer().get_vocab()
    pieces = sorted((i, t) for t, i in vocab.items() if _WORD_PIECE.match(t))
    return tuple(t for _, t in pieces)


@cache
def capitalised_words() -> tuple[str, ...]:
    """The words a spelling drill teaches (`training/spelling.py`) of two letters or more, as text."""
    from sglang_ds41.encoding.prompt_ids import text_tokenizer

    from ..spelling import spelt_words

    tokenizer = text_tokenizer()
    words = (tokenizer.id_to_token(i)[1:] for i, _ in spelt_words())
    return tuple(w for w in words if len(w) > 1)


def real_in_split(name: str, split: str) -> bool:
    """Whether a real name (city, first name, surname) belongs to `split`. Made-up words and
    vocabulary names are split by the hash of their lower-case text, real names by their own,
    so a real name the hash holds out could still come up in training as a one-piece made-up
    word ("Rio": the piece `rio`) or a one-word vocabulary name ("Prague": `ĠPrague`), a given
    one about once in 20,000-60,000 made-up names; 26 of the 59 cities the hash holds out could.
    Those are left out of the held-out split (the training split is unchanged), so that held-out
    names never occur in training. Names of more pieces stay: a given two-piece word comes up
    far less than once in 10^8 draws."""
    if split == HELD_OUT:
        return in_split(name, HELD_OUT) and not drawable_in_training(name)
    return in_split(name, TRAIN)


def drawable_in_training(name: str) -> bool:
    """Whether the training pools draw `name` as a one-piece made-up word or a one-word
    vocabulary name (`Pools.made_up_word`, `Pools.vocabulary_name`)."""
    return in_split(name.lower(), TRAIN) and (
        name.lower() in _piece_set() or name in _capitalised_set()
    )


@cache
def _piece_set() -> frozenset[str]:
    return frozenset(word_pieces())


@cache
def _capitalised_set() -> frozenset[str]:
    return frozenset(capitalised_words())


@dataclass(frozen=True)
class Pools:
    """The entities of one split; every draw takes a `random.Random`."""

    split: str = TRAIN
    vocabulary_names: float = 0.0  # share of made-up names that open with a capitalised word
    real_names: bool = True  # False: every city, person and company name is made up (name drills)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}, expected one of {SPLITS}")

    @property
    def _held_out(self) -> bool:
        return self.split == HELD_OUT

    def _real(self, names: list[str]) -> list[str]:
        return [n for n in names if real_in_split(n, self.split)]

    def made_up_word(self, rng: random.Random) -> str:
        """A word of 1-3 vocabulary pieces (2-3 when held out), of this split by its hash."""
        pieces = word_pieces()
        while True:
            n = rng.choice((2, 2, 3)) if self._held_out else rng.choice((1, 2, 2, 3))
            word = "".join(rng.choice(pieces) for _ in range(n))
            if in_split(word.lower(), self.split):
                return word

    def made_up_name(self, rng: random.Random) -> str:
        if self.vocabulary_names and rng.random() < self.vocabulary_names:
            return self.vocabulary_name(rng)
        return self.made_up_word(rng).capitalize()

    def vocabulary_name(self, rng: random.Random) -> str:
        """A capitalised word of the vocabulary, alone or with one lower-case piece after it."""
        words, pieces = capitalised_words(), word_pieces()
        while True:
            name = rng.choice(words) + (rng.choice(pieces) if rng.random() < 0.3 else "")
            if in_split(name.lower(), self.split):
                return name

    def city(self, rng: random.Random) -> str:
        if self.real_names and rng.random() < 0.6:
            return rng.choice(split_cities(self.split))
        return self.made_up_name(rng)

    def cities(self, rng: random.Random, n: int) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            c = self.city(rng)
            if c not in out:
                out.append(c)
        return out

    def first_name(self, rng: random.Random) -> str:
        if self.real_names and rng.random() < 0.7:
            return rng.choice(self._real(_names(FIRST_NAMES)))
        return self.made_up_name(rng)

    def person(self, rng: random.Random) -> str:
        real = self.real_names and rng.random() < 0.7
        surname = rng.choice(self._real(_names(SURNAMES))) if real else self.made_up_name(rng)
        return f"{self.first_name(rng)} {surname}"

    def company(self, rng: random.Random) -> str:
        made_up = not self.real_names or rng.random() < 0.6
        base = self.made_up_name(rng) if made_up else rng.choice(self._real(_names(SURNAMES)))
        if rng.random() < 0.3:
            base = base.upper()
        return f"{base} {rng.choice(COMPANY_SUFFIXES)}"

    def email(self, rng: random.Random) -> str:
        user = self.made_up_word(rng) if rng.random() < 0.5 else self.first_name(rng).lower()
        domain = self.made_up_word(rng)
        return f"{user}@{domain}.{rng.choice(('com', 'org', 'net', 'io', 'de', 'fr', 'co.uk'))}"

    def title(self, rng: random.Random, words: tuple[int, int] = (1, 3)) -> str:
        n = rng.randint(*words)
        return " ".join(self.made_up_word(rng) if i else self.made_up_name(rng) for i in range(n))


@cache
def split_cities(split: str) -> tuple[str, ...]:
    """The real cities of `split`."""
    return tuple(c for c in _cities() if real_in_split(c, split))


def capitals() -> dict[str, str]:
    """The facts the model is meant to remember (both splits)."""
    return dict(COUNTRY_CAPITALS)


# ---- numbers ---------------------------------------------------------------------------------


def temperature(rng: random.Random) -> float:
    """Degrees Celsius with one decimal (sometimes .0), as a weather tool reports them."""
    return (
        round(rng.uniform(-25.0, 42.0) * 2) / 2 if rng.random() < 0.5 else round(rng.uniform(-25.0, 42.0), 1)
    )


def integer(rng: random.Random, digits: tuple[int, int] = (1, 4)) -> int:
    n = rng.randint(*digits)
    return rng.randint(10 ** (n - 1) if n > 1 else 0, 10**n - 1)


def decimal(rng: random.Random) -> float:
    return round(rng.uniform(0.5, 5000.0), rng.choice((1, 2)))


def amount(rng: random.Random) -> float:
    """A price with two decimals (a trailing zero may be dropped by JSON)."""
    return round(rng.uniform(0.5, 2500.0), 2)


def date(rng: random.Random) -> str:
    return f"{rng.randint(2020, 2031)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def clock(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.choice((0, 15, 30, 45, rng.randint(0, 59))):02d}"


def code(rng: random.Random) -> str:
    """An identifier like `INV-2025-117`, `A7K2` or `2025-117`."""
    kind = rng.randrange(3)
    if kind == 0:
        prefix = rng.choice(("INV", "ORD", "PO", "TKT", "REF"))
        return f"{prefix}-{rng.randint(2020, 2031)}-{integer(rng, (2, 4))}"
    if kind == 1:
        alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(4, 8)))
    return f"{rng.randint(2020, 2031)}-{integer(rng, (2, 4))}"


def join_names(names: list[str]) -> str:
    """"A", "A and B", "A, B and C": how the corpus lists names in prose."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
