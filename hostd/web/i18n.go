package web

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// The pages speak English and German, in the product page's words. A
// browser gets the language it prefers (Accept-Language) until the person
// picks one, which a cookie keeps.

// lang is a page's language.
type lang struct {
	Code string
	text map[string]string
}

// langChoice is a language the switch offers.
type langChoice struct{ Code, Name string }

var languages = []langChoice{{"en", "EN"}, {"de", "DE"}}

// langCookie keeps the language a person picked.
const langCookie = "lang"

func langByCode(code string) (lang, bool) {
	switch code {
	case "en":
		return lang{Code: "en", text: english}, true
	case "de":
		return lang{Code: "de", text: german}, true
	}
	return lang{}, false
}

// requestLang picks the page's language: the cookie's, else the first
// language of Accept-Language (by q) that the pages speak, else English.
func requestLang(r *http.Request) lang {
	if c, err := r.Cookie(langCookie); err == nil {
		if l, ok := langByCode(c.Value); ok {
			return l
		}
	}
	best, bestQ := "en", -1.0
	for _, part := range strings.Split(r.Header.Get("Accept-Language"), ",") {
		tag, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		q := 1.0
		if v, ok := strings.CutPrefix(strings.TrimSpace(params), "q="); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				q = f
			}
		}
		primary, _, _ := strings.Cut(strings.ToLower(tag), "-")
		if _, ok := langByCode(primary); ok && q > bestQ && q > 0 {
			best, bestQ = primary, q
		}
	}
	l, _ := langByCode(best)
	return l
}

// T is the text of key, formatted with args; a key missing in German
// falls back to English, and a missing key shows itself (tests catch it).
func (l lang) T(key string, args ...any) string {
	s, ok := l.text[key]
	if !ok {
		if s, ok = english[key]; !ok {
			return key
		}
	}
	if len(args) > 0 {
		return fmt.Sprintf(s, args...)
	}
	return s
}

// jsKeys are the texts the live timeline's script needs.
var jsKeys = []string{
	"cat.Queued", "cat.MicroVM", "cat.Shell", "cat.Web", "cat.Connection", "cat.Network", "cat.Model", "cat.Successful",
	"cat.Failed", "cat.Timed out", "cat.Budget exceeded", "cat.Canceled", "cat.Worker destroyed",
	"msg.reserved", "msg.summary", "msg.settled", "exit.code", "exit.running", "exit.signal", "exit.timedout",
	"status.queued", "status.running", "status.succeeded", "status.failed", "status.timed_out", "status.budget_exceeded",
	"status.canceled", "spent", "player.play", "player.pause", "pg.started", "pg.failed",
}

// jsText is the part of the dictionary the scripts read.
func (l lang) jsText() map[string]string {
	m := make(map[string]string, len(jsKeys))
	for _, k := range jsKeys {
		m[k] = l.T(k)
	}
	return m
}

var english = map[string]string{
	"nav.playground": "Playground",
	"nav.runs":       "Runs",
	"nav.account":    "Account",
	"nav.signin":     "Sign in",
	"nav.signout":    "Sign out",
	"nav.register":   "Register",
	"footer":         "Ephemeral runs untrusted, AI-written code in disposable microVMs",

	"front.lead":     "An AI agent runs code in a microVM made for one run and destroyed after it, within a hard budget. Watch a recorded run, then run it yourself.",
	"front.examples": "Examples",

	"tag.shell":       "Shell",
	"tag.web":         "Web",
	"tag.connections": "Connections",
	"tag.budget":      "Budget limit",
	"tag.replay":      "Replay",

	"watch.example":   "Watch a real run",
	"watch.published": "A published run",
	"watch.own":       "The run",
	"intro.recorded":  "A real run from %s, replayed. Model: %s.",
	"intro.published": "A run from %s, published by its organisation, replayed. Model: %s.",
	"intro.own":       "Created %s. Model: %s.",
	"spent":           "%s of %s",
	"answer.recorded": "Recorded output (English)",
	"answer.output":   "Output",
	"run.purged":      "This run's content was deleted: what remains is its metering and cost.",
	"run.cancel":      "Cancel",
	"run.manage":      "Share or delete",
	"run.published":   "Published: anyone with this link sees the run read-only:",
	"run.publish":     "Publish",
	"run.unpublish":   "Unpublish",
	"run.publish.hint": "Publishing gives the run a public link where anyone can watch its replay, read-only. " +
		"Unpublishing removes the page.",
	"run.publish.zdr":    "A run with zero data retention keeps nothing to show: it cannot be published.",
	"run.publish.purged": "The run's content was deleted: it cannot be published.",
	"run.publish.active": "A run can be published once it has ended.",
	"run.delete":         "Delete content",
	"run.delete.hint":    "Deleting removes the prompt, timeline text, output and recording now (and its public page); the cost stays on record.",
	"run.title":          "Run %s",

	"player.play":  "Play",
	"player.pause": "Pause",
	"player.speed": "Speed",
	"player.end":   "Jump to end",

	"cost.model":   "Model",
	"cost.web":     "Web",
	"cost.compute": "Compute",

	"yourself.h":        "Run it yourself",
	"yourself.p":        "Open the example in the playground with the request fully filled in. It runs in your own account, within the budget shown, against the same read-only example systems.",
	"yourself.p.run":    "Open this request in the playground to run it again in your own account, within the budget shown.",
	"yourself.budget":   "Budget for this example: %s",
	"yourself.open":     "Open in playground",
	"yourself.register": "Register and run",

	"how.h": "How it works",

	"perm.h":               "What the agent can and cannot do",
	"perm.p":               "Permissions are part of the request. Anything not listed here is unavailable to the run.",
	"perm.setting":         "Setting",
	"perm.allowed":         "Allowed",
	"perm.connections":     "Connections",
	"perm.web":             "Web",
	"perm.shell":           "Shell",
	"perm.files":           "Files",
	"perm.zdr":             "Zero data retention",
	"perm.budget":          "Budget",
	"perm.timeout":         "Timeout",
	"perm.none":            "None",
	"perm.off":             "Off",
	"perm.on":              "On",
	"perm.web.on":          "On, through the broker (public addresses only)",
	"perm.shell.on":        "On, inside the isolated machine",
	"perm.zdr.off":         "Off: the log is kept for %d days",
	"perm.zdr.on":          "On: no prompt, output or recording is stored",
	"perm.budget.v":        "%s, a hard limit",
	"perm.timeout.v":       "%d seconds",
	"perm.files.v":         "%d file(s): %s",
	"perm.broker":          "Credentials never enter the machine: a broker adds them to each call and enforces the methods above.",
	"code.h":               "The code",
	"code.p":               "This is the exact request the example sends. Set EPHEMERAL_API_KEY to a member key of your organisation.",
	"code.full":            "Full request body",
	"code.inline":          "The same body, with the files inline.",
	"cat.Queued":           "Queued",
	"cat.MicroVM":          "MicroVM",
	"cat.Shell":            "Shell",
	"cat.Web":              "Web",
	"cat.Connection":       "Connection",
	"cat.Network":          "Network",
	"cat.Model":            "Model",
	"cat.Successful":       "Successful",
	"cat.Failed":           "Failed",
	"cat.Timed out":        "Timed out",
	"cat.Budget exceeded":  "Budget exceeded",
	"cat.Canceled":         "Canceled",
	"cat.Worker destroyed": "Worker destroyed",
	"msg.reserved":         "Budget %s reserved",
	"msg.summary":          "%s model calls, %s tokens",
	"msg.settled":          "%s charged, %s released",
	"exit.code":            "exit %d after %s s",
	"exit.running":         "running…",
	"exit.signal":          "killed by signal %d after %s s",
	"exit.timedout":        "timed out after %s s",

	"status.queued":          "Queued",
	"status.running":         "Running",
	"status.succeeded":       "Successful",
	"status.failed":          "Failed",
	"status.timed_out":       "Timed out",
	"status.budget_exceeded": "Budget exceeded",
	"status.canceled":        "Canceled",

	"form.email":         "Email",
	"form.password":      "Password",
	"signin.h":           "Sign in",
	"signin.new":         "No account yet?",
	"signin.bad":         "Wrong email or password.",
	"signin.throttled":   "Too many failed attempts. Try again in %d minutes.",
	"register.h":         "Register",
	"register.have":      "Have an account?",
	"register.hint":      "You get your own organisation with %s of credit to run the examples, and the read-only example connections.",
	"register.taken":     "An account with this email exists. Sign in instead.",
	"register.email":     "That is not an email address.",
	"register.weak":      "The password must have 8 to 256 characters.",
	"register.throttled": "Too many registrations from your address. Try again in %d minutes.",
	"password.h":         "Change password",
	"password.current":   "Current password",
	"password.new":       "New password",
	"password.submit":    "Change password",
	"password.hint":      "Changing the password signs you out everywhere else.",
	"password.bad":       "The current password is wrong.",
	"password.done":      "Password changed. Other sessions are signed out.",

	"account.h":         "Your account",
	"account.signedin":  "Signed in as %s",
	"account.balance":   "Balance",
	"account.runs":      "Your runs",
	"balance.available": "Available",
	"balance.held":      "Held by active runs",
	"balance.charged":   "Charged",
	"balance.credited":  "Credited",
	"keys.h":            "API keys",
	"keys.p":            "A key lets a program call the API as your organisation: send it as Authorization: Bearer eph_…",
	"keys.new":          "Your new key. Copy it now: it is not shown again.",
	"keys.create":       "Create key",
	"keys.key":          "Key",
	"keys.created":      "Created",
	"keys.used":         "Last used",
	"keys.never":        "never",
	"keys.revoke":       "Revoke",
	"keys.revoked":      "revoked",
	"keys.revoked.done": "Key revoked: it stops working at once.",
	"conn.h":            "Connections",
	"conn.p":            "Systems your runs may call through the broker. Their credentials are stored encrypted and never shown.",
	"conn.name":         "Name",
	"conn.base":         "Base URL",
	"conn.methods":      "Methods",
	"conn.none":         "None.",

	"runs.h":       "Your runs",
	"runs.filter":  "Show:",
	"runs.all":     "all",
	"runs.run":     "Run",
	"runs.status":  "Status",
	"runs.cost":    "Cost",
	"runs.created": "Created",
	"runs.older":   "Older runs",
	"runs.none":    "No runs yet. Start one in the",

	"pg.h":               "Playground",
	"pg.p":               "Every field of a run request. The code below shows the request as you edit it.",
	"pg.offline.h":       "No model provider is configured on this server.",
	"pg.offline.p":       "Examples still run: the model's answers come from their recording, every command runs live in a fresh microVM, charged like any run.",
	"pg.offline.set":     "To run your own prompts, set",
	"pg.offline.or":      "or",
	"pg.offline.restart": "then restart ephemeral serve.",
	"pg.start":           "Start from:",
	"pg.empty":           "an empty request",
	"pg.prompt":          "Prompt",
	"pg.model":           "Model",
	"pg.tools":           "Tools",
	"pg.noconn":          "Your organisation has no connections.",
	"pg.addfile":         "Add file",
	"pg.removefile":      "Remove",
	"pg.path":            "Path",
	"pg.content":         "Content",
	"pg.budget":          "Budget (US$, hard limit)",
	"pg.timeout":         "Timeout (seconds)",
	"pg.replay":          "Replay the model's answers from the example's recording (commands still run live)",
	"pg.run":             "Run",
	"pg.runh":            "Live run",
	"pg.started":         "Run started",
	"pg.failed":          "The run could not start:",
	"pg.model.off":       "provider not configured",
	"pg.model.noprice":   "no price",
	"pg.model.price":     "$%s in / $%s out per M tokens",

	"error.notfound":    "Not found",
	"error.notfound.p":  "There is nothing here, or it is not yours to see.",
	"error.home":        "Back to the examples",
	"error.internal":    "Something went wrong",
	"error.internal.p":  "The server could not answer. Try again.",
	"error.forbidden":   "Refused",
	"error.forbidden.p": "This request came from another site's page and was refused.",
}

var german = map[string]string{
	"nav.playground": "Playground",
	"nav.runs":       "Ausführungen",
	"nav.account":    "Konto",
	"nav.signin":     "Anmelden",
	"nav.signout":    "Abmelden",
	"nav.register":   "Registrieren",
	"footer":         "Ephemeral führt nicht vertrauenswürdigen, KI-geschriebenen Code in Wegwerf-microVMs aus",

	"front.lead":     "Ein KI-Agent führt Code in einer microVM aus, die nur für eine Ausführung entsteht und danach zerstört wird, innerhalb eines festen Budgets. Sehen Sie eine aufgezeichnete Ausführung an und führen Sie sie dann selbst aus.",
	"front.examples": "Beispiele",

	"tag.shell":       "Shell",
	"tag.web":         "Web",
	"tag.connections": "Verbindungen",
	"tag.budget":      "Budgetlimit",
	"tag.replay":      "Wiedergabe",

	"watch.example":   "Eine echte Ausführung ansehen",
	"watch.published": "Eine veröffentlichte Ausführung",
	"watch.own":       "Die Ausführung",
	"intro.recorded":  "Eine echte Ausführung vom %s, erneut abgespielt. Modell: %s.",
	"intro.published": "Eine Ausführung vom %s, von ihrer Organisation veröffentlicht, erneut abgespielt. Modell: %s.",
	"intro.own":       "Erstellt am %s. Modell: %s.",
	"spent":           "%s von %s",
	"answer.recorded": "Aufgezeichnete Ausgabe (Englisch)",
	"answer.output":   "Ausgabe",
	"run.purged":      "Der Inhalt dieser Ausführung wurde gelöscht: Übrig sind ihre Messwerte und Kosten.",
	"run.cancel":      "Abbrechen",
	"run.manage":      "Teilen oder löschen",
	"run.published":   "Veröffentlicht: Jeder mit diesem Link sieht die Ausführung schreibgeschützt:",
	"run.publish":     "Veröffentlichen",
	"run.unpublish":   "Veröffentlichung aufheben",
	"run.publish.hint": "Eine Veröffentlichung gibt der Ausführung einen öffentlichen Link, unter dem jeder ihre Wiedergabe schreibgeschützt ansehen kann. " +
		"Das Aufheben entfernt die Seite.",
	"run.publish.zdr":    "Eine Ausführung mit Null-Datenspeicherung bewahrt nichts auf, was sich zeigen ließe: Sie kann nicht veröffentlicht werden.",
	"run.publish.purged": "Der Inhalt der Ausführung wurde gelöscht: Sie kann nicht veröffentlicht werden.",
	"run.publish.active": "Eine Ausführung kann veröffentlicht werden, sobald sie beendet ist.",
	"run.delete":         "Inhalt löschen",
	"run.delete.hint":    "Das Löschen entfernt Prompt, Zeitverlaufstexte, Ausgabe und Aufzeichnung sofort (und ihre öffentliche Seite); die Kosten bleiben verbucht.",
	"run.title":          "Ausführung %s",

	"player.play":  "Abspielen",
	"player.pause": "Pause",
	"player.speed": "Tempo",
	"player.end":   "Zum Ende springen",

	"cost.model":   "Modell",
	"cost.web":     "Web",
	"cost.compute": "Rechenleistung",

	"yourself.h":        "Selbst ausführen",
	"yourself.p":        "Öffnen Sie das Beispiel im Playground, mit der vollständig ausgefüllten Anfrage. Es läuft in Ihrem eigenen Konto, innerhalb des angezeigten Budgets, gegen dieselben schreibgeschützten Beispielsysteme.",
	"yourself.p.run":    "Öffnen Sie diese Anfrage im Playground, um sie in Ihrem eigenen Konto erneut auszuführen, innerhalb des angezeigten Budgets.",
	"yourself.budget":   "Budget für dieses Beispiel: %s",
	"yourself.open":     "Im Playground öffnen",
	"yourself.register": "Registrieren und ausführen",

	"how.h": "So funktioniert es",

	"perm.h":           "Was der Agent tun kann und was nicht",
	"perm.p":           "Die Berechtigungen sind Teil der Anfrage. Alles, was hier nicht aufgeführt ist, steht der Ausführung nicht zur Verfügung.",
	"perm.setting":     "Einstellung",
	"perm.allowed":     "Erlaubt",
	"perm.connections": "Verbindungen",
	"perm.web":         "Web",
	"perm.shell":       "Shell",
	"perm.files":       "Dateien",
	"perm.zdr":         "Null-Datenspeicherung",
	"perm.budget":      "Budget",
	"perm.timeout":     "Timeout",
	"perm.none":        "Keine",
	"perm.off":         "Aus",
	"perm.on":          "An",
	"perm.web.on":      "An, über den Broker (nur öffentliche Adressen)",
	"perm.shell.on":    "An, innerhalb der abgeschotteten Maschine",
	"perm.zdr.off":     "Aus: Das Protokoll wird %d Tage lang gespeichert",
	"perm.zdr.on":      "An: Weder Prompt noch Ausgabe noch Aufzeichnung werden gespeichert",
	"perm.budget.v":    "%s, ein festes Limit",
	"perm.timeout.v":   "%d Sekunden",
	"perm.files.v":     "%d Datei(en): %s",
	"perm.broker":      "Zugangsdaten gelangen nie in die Maschine: Ein Broker ergänzt sie bei jedem Aufruf und erzwingt die oben genannten Methoden.",
	"code.h":           "Der Code",
	"code.p":           "Das ist die genaue Anfrage, die das Beispiel sendet. Setzen Sie EPHEMERAL_API_KEY auf einen Mitgliedsschlüssel Ihrer Organisation.",
	"code.full":        "Vollständiger Anfragetext",
	"code.inline":      "Derselbe Text, mit den Dateien inline.",

	"cat.Queued":           "In Warteschlange",
	"cat.Connection":       "Verbindung",
	"cat.Network":          "Netzwerk",
	"cat.Model":            "Modell",
	"cat.Successful":       "Erfolgreich",
	"cat.Failed":           "Fehlgeschlagen",
	"cat.Timed out":        "Zeitüberschreitung",
	"cat.Budget exceeded":  "Budget erschöpft",
	"cat.Canceled":         "Abgebrochen",
	"cat.Worker destroyed": "Worker zerstört",
	"msg.reserved":         "Budget %s reserviert",
	"msg.summary":          "%s Modellaufrufe, %s Tokens",
	"msg.settled":          "%s berechnet, %s freigegeben",
	"exit.code":            "Exit %d nach %s s",
	"exit.running":         "läuft…",
	"exit.signal":          "durch Signal %d beendet nach %s s",
	"exit.timedout":        "Zeitüberschreitung nach %s s",

	"status.queued":          "In Warteschlange",
	"status.running":         "Läuft",
	"status.succeeded":       "Erfolgreich",
	"status.failed":          "Fehlgeschlagen",
	"status.timed_out":       "Zeitüberschreitung",
	"status.budget_exceeded": "Budget erschöpft",
	"status.canceled":        "Abgebrochen",

	"form.email":         "E-Mail",
	"form.password":      "Passwort",
	"signin.h":           "Anmelden",
	"signin.new":         "Noch kein Konto?",
	"signin.bad":         "E-Mail oder Passwort ist falsch.",
	"signin.throttled":   "Zu viele Fehlversuche. Versuchen Sie es in %d Minuten erneut.",
	"register.h":         "Registrieren",
	"register.have":      "Schon ein Konto?",
	"register.hint":      "Sie erhalten eine eigene Organisation mit %s Guthaben, um die Beispiele auszuführen, und die schreibgeschützten Beispielverbindungen.",
	"register.taken":     "Zu dieser E-Mail gibt es schon ein Konto. Melden Sie sich an.",
	"register.email":     "Das ist keine E-Mail-Adresse.",
	"register.weak":      "Das Passwort muss 8 bis 256 Zeichen haben.",
	"register.throttled": "Zu viele Registrierungen von Ihrer Adresse. Versuchen Sie es in %d Minuten erneut.",
	"password.h":         "Passwort ändern",
	"password.current":   "Aktuelles Passwort",
	"password.new":       "Neues Passwort",
	"password.submit":    "Passwort ändern",
	"password.hint":      "Eine Änderung meldet Sie überall sonst ab.",
	"password.bad":       "Das aktuelle Passwort ist falsch.",
	"password.done":      "Passwort geändert. Andere Sitzungen sind abgemeldet.",

	"account.h":         "Ihr Konto",
	"account.signedin":  "Angemeldet als %s",
	"account.balance":   "Guthaben",
	"account.runs":      "Ihre Ausführungen",
	"balance.available": "Verfügbar",
	"balance.held":      "Von laufenden Ausführungen reserviert",
	"balance.charged":   "Berechnet",
	"balance.credited":  "Gutgeschrieben",
	"keys.h":            "API-Schlüssel",
	"keys.p":            "Mit einem Schlüssel ruft ein Programm die API als Ihre Organisation auf: Senden Sie ihn als Authorization: Bearer eph_…",
	"keys.new":          "Ihr neuer Schlüssel. Kopieren Sie ihn jetzt: Er wird nicht noch einmal angezeigt.",
	"keys.create":       "Schlüssel erstellen",
	"keys.key":          "Schlüssel",
	"keys.created":      "Erstellt",
	"keys.used":         "Zuletzt benutzt",
	"keys.never":        "nie",
	"keys.revoke":       "Widerrufen",
	"keys.revoked":      "widerrufen",
	"keys.revoked.done": "Schlüssel widerrufen: Er funktioniert ab sofort nicht mehr.",
	"conn.h":            "Verbindungen",
	"conn.p":            "Systeme, die Ihre Ausführungen über den Broker aufrufen dürfen. Ihre Zugangsdaten werden verschlüsselt gespeichert und nie angezeigt.",
	"conn.name":         "Name",
	"conn.base":         "Basis-URL",
	"conn.methods":      "Methoden",
	"conn.none":         "Keine.",

	"runs.h":       "Ihre Ausführungen",
	"runs.filter":  "Zeigen:",
	"runs.all":     "alle",
	"runs.run":     "Ausführung",
	"runs.status":  "Status",
	"runs.cost":    "Kosten",
	"runs.created": "Erstellt",
	"runs.older":   "Ältere Ausführungen",
	"runs.none":    "Noch keine Ausführungen. Starten Sie eine im",

	"pg.h":               "Playground",
	"pg.p":               "Jedes Feld einer Anfrage. Der Code unten zeigt die Anfrage, während Sie sie bearbeiten.",
	"pg.offline.h":       "Auf diesem Server ist kein Modellanbieter eingerichtet.",
	"pg.offline.p":       "Beispiele laufen trotzdem: Die Antworten des Modells kommen aus ihrer Aufzeichnung, jeder Befehl läuft live in einer frischen microVM und wird wie jede Ausführung berechnet.",
	"pg.offline.set":     "Um eigene Prompts auszuführen, setzen Sie",
	"pg.offline.or":      "oder",
	"pg.offline.restart": "und starten Sie ephemeral serve neu.",
	"pg.start":           "Beginnen mit:",
	"pg.empty":           "einer leeren Anfrage",
	"pg.prompt":          "Prompt",
	"pg.model":           "Modell",
	"pg.tools":           "Werkzeuge",
	"pg.noconn":          "Ihre Organisation hat keine Verbindungen.",
	"pg.addfile":         "Datei hinzufügen",
	"pg.removefile":      "Entfernen",
	"pg.path":            "Pfad",
	"pg.content":         "Inhalt",
	"pg.budget":          "Budget (US$, festes Limit)",
	"pg.timeout":         "Timeout (Sekunden)",
	"pg.replay":          "Die Antworten des Modells aus der Aufzeichnung des Beispiels abspielen (Befehle laufen trotzdem live)",
	"pg.run":             "Ausführen",
	"pg.runh":            "Live-Ausführung",
	"pg.started":         "Ausführung gestartet",
	"pg.failed":          "Die Ausführung konnte nicht starten:",
	"pg.model.off":       "Anbieter nicht eingerichtet",
	"pg.model.noprice":   "kein Preis",
	"pg.model.price":     "$%s Eingabe / $%s Ausgabe pro Mio. Tokens",

	"error.notfound":    "Nicht gefunden",
	"error.notfound.p":  "Hier gibt es nichts, oder es ist nicht für Sie bestimmt.",
	"error.home":        "Zurück zu den Beispielen",
	"error.internal":    "Etwas ist schiefgegangen",
	"error.internal.p":  "Der Server konnte nicht antworten. Versuchen Sie es erneut.",
	"error.forbidden":   "Abgelehnt",
	"error.forbidden.p": "Diese Anfrage kam von der Seite einer anderen Website und wurde abgelehnt.",
}
