// Copy buttons: <button data-copy="ID"> copies the value of the element #ID to the clipboard.
// Without the clipboard (an http origin other than localhost) the text is selected instead.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const field = document.getElementById(button.dataset.copy);
  if (!field) return;
  const done = (text) => { button.textContent = text; };
  field.select();
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(field.value).then(() => done("Copied"), () => done("Selected: copy it"));
  } else {
    done("Selected: copy it");
  }
});
