"""Meta and TikTok normalization and hashing of a lead's contact data.

Outside oracle: for the inputs the official `facebook-business` SDK normalizes correctly
(emails, cities, zips with a dash, already-normalized phones, two-letter states and countries,
simple names, external ids), our Meta hashes equal its `Normalize.normalize_field` hashes. Where
the SDK falls short (national phone numbers, dates of birth, state names, punctuation in names,
UK postcodes) our rules are checked against known vectors. The SDK is a test-only dependency
(`pip install -e .[test]`); the oracle tests are skipped without it."""

from __future__ import annotations

import hashlib

import pytest

from appliance.domain import pixel_payloads as pp

LEAD_ID = "lead_01JD5Q3K7Z8Y9X0W1V2T3S4R5P"

# SHA-256 of the normalized strings, computed independently (sha256sum).
SHA = {
    "14155552671": "758fbf68945f21c416814c539ab578876c8d98fb69e6da692def92cd52417fe0",
    "mary@example.com": "f1904cf1a9d73a55fa5de0ac823c4403ded71afd4c3248d00bdcd0866552bb79",
    "19850704": "2168bbab13806c125ed1f35c8838fbe8483ce209a3e34ac1eda34c2bf56714e2",
    "ca": "6959097001d10501ac7d54c0bdb8db61420f658f2922cc26e46d536119a31126",
    "94105": "e73ac16e69f060ee98b0fda5f66f48c4648ee26950e9bab3a097389853fd859e",
    "us": "79adb2a2fce5c6ba215fe5f27f532d4e7edbac4b6a5e09e1ef3a08084a904621",
    "+14155552671": "cb6880e416769253645cb9c6b8989154bf66a56a77fc14c81fb1019663cbb928",
}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def lead(**fields) -> dict:
    return {"leadId": LEAD_ID, "createdAt": "2026-03-10T15:00:00.000Z", **fields}


def user_data(region: str = "US", **fields) -> dict:
    return pp.meta_user_data(lead(**fields), region)


# ---- the outside oracle -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def sdk():
    module = pytest.importorskip("facebook_business.adobjects.serverside.normalize")
    return module.Normalize


@pytest.mark.parametrize("email", ["mary@example.com", "  Mary@Example.COM ", "JOHN_SMITH@GMAIL.COM",
                                   "first.last+tag@sub.example.co.uk"])
def test_email_matches_the_sdk(sdk, email):
    assert user_data(email=email)["em"] == [sdk.normalize_field("em", email)]


@pytest.mark.parametrize("city", ["San Francisco", "Menlo Park", " new york ", "St. Louis", "Winston-Salem",
                                  "Coeur d Alene", "WASHINGTON"])
def test_city_matches_the_sdk(sdk, city):
    assert user_data(address={"city": city})["ct"] == [sdk.normalize_field("ct", city)]


@pytest.mark.parametrize("zip_code", ["94025-1234", "10001-0001", " 60614-2020 ", "94025"])
def test_zip_with_a_dash_matches_the_sdk(sdk, zip_code):
    assert user_data(address={"zip": zip_code}, country="US")["zp"] == [sdk.normalize_field("zp", zip_code)]


@pytest.mark.parametrize("e164", ["+14155552671", "+16505551234", "+442071838750", "+33612345678"])
def test_already_normalized_phone_matches_the_sdk(sdk, e164):
    ours = user_data(phoneE164=e164)["ph"]
    assert ours == [sdk.normalize_field("ph", e164)] == [sdk.normalize_field("ph", e164[1:])]


@pytest.mark.parametrize("field, value, lead_fields", [
    ("st", "CA", {"address": {"state": "CA"}, "country": "US"}),
    ("st", "tx", {"address": {"state": "tx"}, "country": "US"}),
    ("country", "US", {"country": "US"}),
    ("country", "gb", {"country": "gb"}),
    ("fn", "Mary", {"firstName": "Mary"}),
    ("ln", " DOE ", {"lastName": " DOE "}),
    ("db", "19850704", {"dateOfBirth": "19850704"}),
    ("external_id", LEAD_ID, {}),
])
def test_other_simple_fields_match_the_sdk(sdk, field, value, lead_fields):
    assert user_data(**lead_fields)[field] == [sdk.normalize_field(field, value)]


def test_where_the_sdk_falls_short_it_differs_from_our_rules(sdk):
    # The SDK keeps a national number without its country code, hashes a dashed date as written,
    # keeps state names and punctuation in names: the cases our known vectors cover below.
    assert sdk.normalize_field("ph", "(415) 555-2671") != SHA["14155552671"]
    assert sdk.normalize_field("db", "1985-07-04") != SHA["19850704"]
    assert sdk.normalize_field("st", "California") != SHA["ca"]
    assert sdk.normalize_field("fn", "O'Neil") != sha("oneil")


# ---- known vectors where the SDK falls short ------------------------------------------------------

@pytest.mark.parametrize("phone, country, normalized", [
    ("(415) 555-2671", None, "14155552671"),
    ("415.555.2671", "US", "14155552671"),
    ("1-415-555-2671", "US", "14155552671"),
    ("020 7183 8750", "GB", "442071838750"),
    ("06 12 34 56 78", "FR", "33612345678"),
])
def test_national_phone_numbers(phone, country, normalized):
    fields = {"phone": phone, **({"country": country} if country else {})}
    assert user_data(**fields)["ph"] == [sha(normalized)]
    if normalized == "14155552671":
        assert user_data(**fields)["ph"] == [SHA["14155552671"]]


@pytest.mark.parametrize("dob, normalized", [
    ("1985-07-04", "19850704"), ("1985-7-4", "19850704"), ("07/04/1985", "19850704"), ("7/4/1985", "19850704"),
    ("19850704", "19850704"), (" 1985-07-04 ", "19850704"),
])
def test_dates_of_birth(dob, normalized):
    assert user_data(dateOfBirth=dob)["db"] == [SHA[normalized]]


@pytest.mark.parametrize("dob", ["1985-02-30", "04/07/85", "July 4 1985", "", "1985-13-01"])
def test_unreadable_dates_of_birth_are_left_out(dob):
    assert "db" not in user_data(dateOfBirth=dob)


@pytest.mark.parametrize("state, country, normalized", [
    ("California", "US", "ca"), ("california", None, "ca"), (" CA ", "US", "ca"), ("C.A.", "US", "ca"),
    ("New York", "US", "ny"), ("N.Y.", "US", "ny"), ("District of Columbia", "US", "dc"),
    ("Puerto Rico", "US", "pr"), ("Ontario", "CA", "on"), ("Québec", "CA", "qc"), ("BC", "CA", "bc"),
    ("Bavaria", "DE", "bavaria"), ("Île-de-France", "FR", "îledefrance"),
])
def test_states(state, country, normalized):
    fields = {"address": {"state": state}, **({"country": country} if country else {})}
    assert user_data(**fields)["st"] == [sha(normalized)]
    if normalized == "ca":
        assert user_data(**fields)["st"] == [SHA["ca"]]


@pytest.mark.parametrize("name, normalized", [
    ("O'Neil", "oneil"), ("Mary-Ann", "maryann"), ("St. John", "st john"), (" Jean   Luc ", "jean luc"),
    ("José", "josé"), ("Jose\u0301", "josé"), ("Smith, Jr.", "smith jr"), ("D’Angelo", "dangelo"),
])
def test_names_lose_punctuation(name, normalized):
    assert user_data(firstName=name, lastName=name)["fn"] == [sha(normalized)]
    assert user_data(firstName=name, lastName=name)["ln"] == [sha(normalized)]


@pytest.mark.parametrize("zip_code, country, normalized", [
    ("94105", "US", "94105"), ("94105-1234", "US", "94105"), ("94105 1234", "US", "94105"),
    ("941051234", "US", "94105"), ("SW1A 1AA", "GB", "sw1a1"), ("M1 1AE", "GB", "m11"),
    ("K1A 0B1", "CA", "k1a0b1"), ("75008", "FR", "75008"),
])
def test_zips(zip_code, country, normalized):
    assert user_data(address={"zip": zip_code}, country=country)["zp"] == [sha(normalized)]


def test_country_comes_from_the_lead_then_its_phone_then_the_region():
    assert user_data(country="GB", phoneE164="+14155552671")["country"] == [sha("gb")]
    assert user_data(phoneE164="+442071838750")["country"] == [sha("gb")]
    assert user_data(phoneE164="+14155552671")["country"] == [SHA["us"]]
    assert user_data(region="DE")["country"] == [sha("de")]


def test_full_meta_user_data():
    data = user_data(
        email=" Mary@Example.com", phoneE164="+14155552671", firstName="Mary", lastName="O'Neil",
        dateOfBirth="1985-07-04", address={"city": "San Francisco", "state": "California", "zip": "94105-1234"},
        attribution={"ipAddress": "203.0.113.7", "userAgent": "Mozilla/5.0", "fbclid": "IwAR2abc", "fbp": "fb.1.1.2"})
    assert data == {
        "em": [SHA["mary@example.com"]], "ph": [SHA["14155552671"]], "fn": [sha("mary")], "ln": [sha("oneil")],
        "db": [SHA["19850704"]], "ct": [sha("sanfrancisco")], "st": [SHA["ca"]], "zp": [SHA["94105"]],
        "country": [SHA["us"]], "external_id": [sha(LEAD_ID.lower())],
        "client_ip_address": "203.0.113.7", "client_user_agent": "Mozilla/5.0",
        "fbc": "fb.1.1773154800000.IwAR2abc", "fbp": "fb.1.1.2",
    }


def test_fbc_is_kept_when_stored_and_built_from_fbclid_otherwise():
    assert pp.fbc_of(lead(attribution={"fbc": "fb.1.1554763741205.AbCd", "fbclid": "other"})) == \
        "fb.1.1554763741205.AbCd"
    assert pp.fbc_of(lead(attribution={"fbclid": "AbCd"})) == "fb.1.1773154800000.AbCd"
    assert pp.fbc_of(lead(attribution={})) is None


def test_event_id_is_stable_per_lead_and_event():
    assert pp.event_id(LEAD_ID, "Lead") == pp.event_id(LEAD_ID, "Lead") == sha(f"{LEAD_ID}:Lead")
    assert pp.event_id(LEAD_ID, "Purchase") != pp.event_id(LEAD_ID, "Lead")
    assert pp.event_id("lead_other", "Lead") != pp.event_id(LEAD_ID, "Lead")


def test_tiktok_user():
    user = pp.tiktok_user(lead(email=" Mary@Example.com ", phone="(415) 555-2671",
                               attribution={"ttclid": "E.C.P.abc", "ttp": "ttp-1", "ipAddress": "203.0.113.7",
                                            "userAgent": "Mozilla/5.0"}), "US")
    assert user == {"email": SHA["mary@example.com"], "phone": SHA["+14155552671"],
                    "external_id": sha(LEAD_ID.lower()), "ttclid": "E.C.P.abc", "ttp": "ttp-1",
                    "ip": "203.0.113.7", "user_agent": "Mozilla/5.0"}


def test_missing_data_is_left_out():
    assert user_data() == {"external_id": [sha(LEAD_ID.lower())], "country": [SHA["us"]]}
    assert pp.tiktok_user(lead(email="not-an-email"), "US") == {"external_id": sha(LEAD_ID.lower())}
