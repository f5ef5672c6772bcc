// Capstan dashboard: secret values are sealed in the browser before they leave the page.
//
// A form marked `data-seal` carries the ingress recipient (`data-recipient-id`,
// `data-recipient-key`, base64 X25519), the method it writes (`data-method`: secrets.create or
// secrets.rotate), the owner reference (`data-owner`) and either a fixed key (`data-key`) or a
// key field (`[data-seal-key]`). The value is typed into `[data-seal-typed]` or generated here
// into `[data-seal-generated]`; neither field has a `name`, so the browser never sends them.
// On submit the value is sealed exactly as host/src/secrets/ingress.rs `seal_to` does:
//
//   ephemeral X25519 key pair, shared = X25519(ephemeral, recipient)
//   content key = HKDF-SHA256(salt = ephemeralPub || recipientPub, ikm = shared,
//                             info = "capstan sealed input v1", 32 bytes)
//   AES-256-GCM, random 12-byte nonce, AAD = JSON {"profile","recipientId","target"}
//   target = JSON {"method","owner","key"} (ingress::target; keys in that order)
//
// JSON.stringify writes these strings byte for byte as serde_json does (the same escapes for
// quotes, backslashes and control characters; everything else as UTF-8). Only the sealed JSON
// goes into the hidden `sealed` field; the plain fields are emptied before the form is sent.
(function () {
  "use strict";

  var PROFILE = "capstan-sealed-input-v1";
  var INFO = "capstan sealed input v1";
  // the alphabets of the server's generator (host/src/secrets/methods.rs)
  var ALPHABETS = {
    alphanumeric: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
    hex: "0123456789abcdef",
    base64url: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
    printable: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&()*+,-./:;<=>?@[]^_{|}~",
  };
  var MAX_VALUE_BYTES = 64 * 1024;

  function utf8(text) {
    return new TextEncoder().encode(text);
  }

  function toBase64(bytes) {
    var text = "";
    for (var i = 0; i < bytes.length; i += 0x8000) {
      text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(text);
  }

  function fromBase64(text) {
    var raw = atob(text);
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return bytes;
  }

  // `length` characters drawn uniformly from `alphabet`: a random byte is used only when it is
  // below the largest multiple of the alphabet's size (rejection sampling), as the server does.
  function generate(length, alphabet) {
    var limit = 256 - (256 % alphabet.length);
    var out = "";
    var bytes = new Uint8Array(Math.max(64, length * 2));
    while (out.length < length) {
      crypto.getRandomValues(bytes);
      for (var i = 0; i < bytes.length && out.length < length; i++) {
        if (bytes[i] < limit) out += alphabet[bytes[i] % alphabet.length];
      }
    }
    bytes.fill(0);
    return out;
  }

  function target(method, owner, key) {
    return JSON.stringify({ method: method, owner: owner, key: key });
  }

  function aad(recipientId, target) {
    return utf8(JSON.stringify({ profile: PROFILE, recipientId: recipientId, target: target }));
  }

  function concat(a, b) {
    var out = new Uint8Array(a.length + b.length);
    out.set(a, 0);
    out.set(b, a.length);
    return out;
  }

  // Seal `plaintext` (bytes) to the recipient for `target`: the SealedInput JSON object.
  async function seal(recipientId, recipientKey, target, plaintext) {
    var subtle = crypto.subtle;
    var recipientRaw = fromBase64(recipientKey);
    if (recipientRaw.length !== 32) throw new Error("the ingress recipient's key is not 32 bytes");
    var recipient = await subtle.importKey("raw", recipientRaw, { name: "X25519" }, false, []);
    var ephemeral = await subtle.generateKey({ name: "X25519" }, false, ["deriveBits"]);
    var ephemeralRaw = new Uint8Array(await subtle.exportKey("raw", ephemeral.publicKey));
    var shared = new Uint8Array(await subtle.deriveBits({ name: "X25519", public: recipient }, ephemeral.privateKey, 256));
    var ikm = await subtle.importKey("raw", shared, "HKDF", false, ["deriveKey"]);
    shared.fill(0);
    var key = await subtle.deriveKey(
      { name: "HKDF", hash: "SHA-256", salt: concat(ephemeralRaw, recipientRaw), info: utf8(INFO) },
      ikm,
      { name: "AES-GCM", length: 256 },
      false,
      ["encrypt"]
    );
    var nonce = crypto.getRandomValues(new Uint8Array(12));
    var ciphertext = new Uint8Array(
      await subtle.encrypt({ name: "AES-GCM", iv: nonce, additionalData: aad(recipientId, target), tagLength: 128 }, key, plaintext)
    );
    return {
      profile: PROFILE,
      recipientId: recipientId,
      ephemeralPublicKey: toBase64(ephemeralRaw),
      nonce: toBase64(nonce),
      ciphertext: toBase64(ciphertext),
    };
  }

  function field(form, selector) {
    return form.querySelector(selector);
  }

  function say(form, text) {
    var box = field(form, "[data-seal-error]");
    if (!box) return;
    box.hidden = !text;
    var message = field(box, "[data-seal-error-text]") || box;
    message.textContent = text || "";
  }

  function mode(form) {
    var chosen = field(form, "[data-seal-mode]:checked");
    return chosen ? chosen.value : "typed";
  }

  function showMode(form) {
    var current = mode(form);
    form.querySelectorAll("[data-seal-panel]").forEach(function (panel) {
      panel.hidden = panel.getAttribute("data-seal-panel") !== current;
    });
    say(form, "");
  }

  function clearPlain(form) {
    form.querySelectorAll("[data-seal-typed], [data-seal-generated]").forEach(function (input) {
      input.value = "";
    });
    var shown = field(form, "[data-seal-shown]");
    if (shown) shown.hidden = true;
  }

  function onGenerate(form) {
    var length = parseInt((field(form, "[data-seal-length]") || {}).value, 10);
    var alphabet = ALPHABETS[(field(form, "[data-seal-alphabet]") || {}).value];
    if (!(length >= 16 && length <= 512) || !alphabet) {
      say(form, "Choose a length of 16 to 512 characters and an alphabet.");
      return;
    }
    if (!window.crypto || !crypto.getRandomValues) {
      say(form, "This browser cannot generate random values here.");
      return;
    }
    var output = field(form, "[data-seal-generated]");
    output.value = generate(length, alphabet);
    var shown = field(form, "[data-seal-shown]");
    if (shown) shown.hidden = false;
    say(form, "");
  }

  function onCopy(form) {
    var output = field(form, "[data-seal-generated]");
    if (!output || !output.value) return;
    output.select();
    var done = function () {
      var note = field(form, "[data-seal-copied]");
      if (note) note.hidden = false;
    };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(output.value).then(done, function () {
        say(form, "The browser did not allow copying: select the value and copy it yourself.");
      });
    } else {
      say(form, "Select the value and copy it yourself.");
    }
  }

  async function onSubmit(form, event) {
    if (form.dataset.sealed === "yes") return; // sealed already: let it go
    event.preventDefault();
    say(form, "");
    if (!window.isSecureContext || !window.crypto || !crypto.subtle) {
      say(form, "Values are sealed in the browser, which needs a secure page: open Capstan over https (or on localhost).");
      return;
    }
    var plain = mode(form) === "generated" ? field(form, "[data-seal-generated]") : field(form, "[data-seal-typed]");
    var text = plain ? plain.value : "";
    if (!text) {
      say(form, mode(form) === "generated" ? "Generate a value first." : "Type the value first.");
      return;
    }
    var keyField = field(form, "[data-seal-key]");
    var key = keyField ? keyField.value.trim() : form.getAttribute("data-key");
    if (keyField) keyField.value = key;
    var bytes = utf8(text);
    if (bytes.length > MAX_VALUE_BYTES) {
      bytes.fill(0);
      say(form, "A value is at most 64 KiB (input-oversized); nothing was sent.");
      return;
    }
    var button = field(form, "[type=submit]");
    if (button) button.disabled = true;
    try {
      var sealed = await seal(
        form.getAttribute("data-recipient-id"),
        form.getAttribute("data-recipient-key"),
        target(form.getAttribute("data-method"), form.getAttribute("data-owner"), key),
        bytes
      );
      field(form, "input[name=sealed]").value = JSON.stringify(sealed);
    } catch (e) {
      if (button) button.disabled = false;
      say(form, "The value could not be sealed in this browser (" + (e && e.name ? e.name : "error") + "); nothing was sent.");
      return;
    } finally {
      bytes.fill(0);
    }
    clearPlain(form);
    form.dataset.sealed = "yes";
    form.submit();
  }

  function wire(form) {
    form.querySelectorAll("[data-seal-mode]").forEach(function (radio) {
      radio.addEventListener("change", function () {
        showMode(form);
      });
    });
    var generateButton = field(form, "[data-seal-generate]");
    if (generateButton) generateButton.addEventListener("click", function () { onGenerate(form); });
    var copyButton = field(form, "[data-seal-copy]");
    if (copyButton) copyButton.addEventListener("click", function () { onCopy(form); });
    form.addEventListener("submit", function (event) {
      onSubmit(form, event);
    });
    showMode(form);
    // a form put back from the history is empty again
    window.addEventListener("pageshow", function () {
      clearPlain(form);
      field(form, "input[name=sealed]").value = "";
      delete form.dataset.sealed;
      var button = field(form, "[type=submit]");
      if (button) button.disabled = false;
    });
    form.setAttribute("data-seal-ready", "true");
  }

  function start() {
    document.querySelectorAll("form[data-seal]").forEach(wire);
  }

  // exposed for the tests and the curious: the same functions the forms use
  window.capstanSeal = { seal: seal, target: target, generate: generate, alphabets: ALPHABETS };

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
